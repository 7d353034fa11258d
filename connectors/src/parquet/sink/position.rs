//! The parts of an error row's position, read back from its text, so that
//! errors.parquet carries them as columns to join on: an error row holds
//! its position as `SourcePosition` writes it for people.

/// File, row group and row a position names; `None` where it names none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Parts<'a> {
    pub file: Option<&'a str>,
    pub row_group: Option<u32>,
    /// Counted from the start of the file, not of the row group.
    pub row: Option<u64>,
}

impl<'a> Parts<'a> {
    /// Reads "FILE: row group G, row R" (a row of a Parquet trace), "FILE:
    /// row group G" (a row group that failed as a whole) and "FILE: row R";
    /// anything else (a Kafka offset, a whole file) has no parts.
    pub fn of(position: &'a str) -> Self {
        let file = |f: &'a str| (!f.is_empty()).then_some(f);
        let Some((head, last)) = trailing_number(position) else {
            return Self::default();
        };
        if let Some(rest) = head.strip_suffix(", row ")
            && let Some((rest, group)) = trailing_number(rest)
            && let Some(f) = rest.strip_suffix(": row group ")
            && let (Ok(group), Ok(row)) = (group.parse(), last.parse())
        {
            return Self {
                file: file(f),
                row_group: Some(group),
                row: Some(row),
            };
        }
        if let Some(f) = head.strip_suffix(": row group ")
            && let Ok(group) = last.parse()
        {
            return Self {
                file: file(f),
                row_group: Some(group),
                row: None,
            };
        }
        if let Some(f) = head.strip_suffix(": row ")
            && let Ok(row) = last.parse()
        {
            return Self {
                file: file(f),
                row_group: None,
                row: Some(row),
            };
        }
        Self::default()
    }
}

/// `s` without the digits it ends in, and those digits (at least one; no
/// sign, as positions write numbers).
fn trailing_number(s: &str) -> Option<(&str, &str)> {
    let digits = s.bytes().rev().take_while(u8::is_ascii_digit).count();
    (digits > 0).then(|| s.split_at(s.len() - digits))
}

#[cfg(test)]
mod tests {
    use super::Parts;
    use crate::records::SourcePosition;

    #[test]
    fn a_parquet_position_reads_back_as_written() {
        let written = SourcePosition::Parquet {
            file: "t/requests.parquet".into(),
            row_group: 3,
            row: 200_117,
        }
        .to_string();
        assert_eq!(
            Parts::of(&written),
            Parts {
                file: Some("t/requests.parquet"),
                row_group: Some(3),
                row: Some(200_117),
            }
        );
        // A file name that itself looks like a position keeps its text.
        let odd = SourcePosition::Parquet {
            file: "a: row group 1, row 2/x.parquet".into(),
            row_group: 4,
            row: 5,
        }
        .to_string();
        assert_eq!(
            Parts::of(&odd),
            Parts {
                file: Some("a: row group 1, row 2/x.parquet"),
                row_group: Some(4),
                row: Some(5),
            }
        );
    }

    #[test]
    fn a_row_group_or_a_row_alone_fills_its_part_only() {
        assert_eq!(
            Parts::of("t/requests.parquet: row group 7"),
            Parts {
                file: Some("t/requests.parquet"),
                row_group: Some(7),
                row: None,
            }
        );
        assert_eq!(
            Parts::of("t/requests.parquet: row 12"),
            Parts {
                file: Some("t/requests.parquet"),
                row_group: None,
                row: Some(12),
            }
        );
    }

    #[test]
    fn other_positions_have_no_parts() {
        let kafka = SourcePosition::Kafka {
            topic: "requests".into(),
            partition: 2,
            offset: 99,
        }
        .to_string();
        for p in [
            kafka.as_str(),
            "t/requests.parquet",
            "x",
            "",
            "t: row group -1, row 2",
            "t: row +3",
        ] {
            assert_eq!(Parts::of(p), Parts::default(), "{p:?}");
        }
        assert_eq!(Parts::of(": row 3").file, None, "no file name");
    }
}
