//! Line charts as SVG: the pictures `replay --out` and `bench serve`
//! write. A handful of elements (axes with ticks, one `polyline` per
//! series, a legend), no dependencies, so a picture can be checked by
//! reading it back.

use std::fmt::Write;

/// One line of a chart.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A chart: series over shared axes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    /// Y axis range; None: from 0 (or the lowest value, if negative) to the
    /// highest value.
    pub y_range: Option<(f64, f64)>,
    /// A dashed horizontal reference line with its label (an SLO).
    pub reference: Option<(f64, String)>,
    /// A dot at every point as well as the line.
    pub markers: bool,
}

const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];
// Canvas and margins (px); the right margin holds the legend.
const W: f64 = 720.0;
const H: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 55.0;
const TICKS: usize = 5;

// The plot area inside the margins.
const PLOT_W: f64 = W - LEFT - RIGHT;
const PLOT_H: f64 = H - TOP - BOTTOM;
const PLOT_BOTTOM: f64 = TOP + PLOT_H;
const PLOT_RIGHT: f64 = LEFT + PLOT_W;

/// The data ranges the plot area shows, and how values map into it.
#[derive(Clone, Copy, Debug)]
struct Frame {
    x0: f64,
    x1: f64,
    y0: f64,
    y1: f64,
}

impl Frame {
    fn x(&self, v: f64) -> f64 {
        LEFT + (v - self.x0) / (self.x1 - self.x0) * PLOT_W
    }

    /// Values outside the range are drawn at its edge.
    fn y(&self, v: f64) -> f64 {
        TOP + PLOT_H - (v.clamp(self.y0, self.y1) - self.y0) / (self.y1 - self.y0) * PLOT_H
    }
}

impl LineChart {
    /// The chart as a standalone SVG document.
    pub fn to_svg(&self) -> String {
        let frame = self.frame();
        let mut svg = String::new();
        let _ = writeln!(
            svg,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" \
             font-family=\"sans-serif\" font-size=\"12\">"
        );
        let _ = writeln!(svg, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>");
        let _ = writeln!(
            svg,
            "<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">{}</text>",
            LEFT + PLOT_W / 2.0,
            escape(&self.title)
        );
        self.axes(&mut svg, &frame);
        if let Some((v, label)) = &self.reference {
            let py = frame.y(*v);
            let _ = writeln!(
                svg,
                "<line class=\"reference\" x1=\"{LEFT}\" y1=\"{py:.1}\" x2=\"{PLOT_RIGHT}\" y2=\"{py:.1}\" \
                 stroke=\"gray\" stroke-dasharray=\"4\"/><text x=\"{}\" y=\"{:.1}\" fill=\"gray\">{}</text>",
                PLOT_RIGHT + 4.0,
                py + 4.0,
                escape(label)
            );
        }
        for (i, s) in self.series.iter().enumerate() {
            self.series_and_legend(&mut svg, &frame, i, s);
        }
        svg.push_str("</svg>\n");
        svg
    }

    /// The ranges of the finite points: x over the data, y from the
    /// chart's `y_range`, else from 0 (or below) to the highest value or
    /// reference line.
    fn frame(&self) -> Frame {
        let finite = |v: &f64| v.is_finite();
        let xs: Vec<f64> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .filter(finite)
            .collect();
        let ys: Vec<f64> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .filter(finite)
            .collect();
        let (x0, x1) = span(&xs, None);
        let (y0, y1) = self.y_range.unwrap_or_else(|| {
            let reference = self.reference.iter().map(|r| r.0);
            let all: Vec<f64> = ys.iter().copied().chain(reference).collect();
            span(&all, Some(0.0))
        });
        Frame { x0, x1, y0, y1 }
    }

    /// Axes, ticks with their values and grid lines, and the axis labels.
    fn axes(&self, svg: &mut String, frame: &Frame) {
        let (bottom, right) = (PLOT_BOTTOM, PLOT_RIGHT);
        let _ = writeln!(
            svg,
            "<path class=\"axes\" d=\"M{LEFT},{TOP} V{bottom} H{right}\" fill=\"none\" stroke=\"black\"/>"
        );
        let Frame { x0, x1, y0, y1 } = *frame;
        for i in 0..=TICKS {
            let f = i as f64 / TICKS as f64;
            let (xv, yv) = (x0 + f * (x1 - x0), y0 + f * (y1 - y0));
            let (px, py) = (frame.x(xv), frame.y(yv));
            let _ = writeln!(
                svg,
                "<line x1=\"{px:.1}\" y1=\"{bottom}\" x2=\"{px:.1}\" y2=\"{}\" stroke=\"black\"/>\
                 <text class=\"xtick\" x=\"{px:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                bottom + 5.0,
                bottom + 18.0,
                tick(xv)
            );
            let _ = writeln!(
                svg,
                "<line x1=\"{}\" y1=\"{py:.1}\" x2=\"{LEFT}\" y2=\"{py:.1}\" stroke=\"black\"/>\
                 <line x1=\"{LEFT}\" y1=\"{py:.1}\" x2=\"{right}\" y2=\"{py:.1}\" stroke=\"#eeeeee\"/>\
                 <text class=\"ytick\" x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                LEFT - 5.0,
                LEFT - 8.0,
                py + 4.0,
                tick(yv)
            );
        }
        let _ = writeln!(
            svg,
            "<text class=\"xlabel\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            LEFT + PLOT_W / 2.0,
            H - 12.0,
            escape(&self.x_label)
        );
        let _ = writeln!(
            svg,
            "<text class=\"ylabel\" x=\"18\" y=\"{0}\" transform=\"rotate(-90 18 {0})\" \
             text-anchor=\"middle\">{1}</text>",
            TOP + PLOT_H / 2.0,
            escape(&self.y_label)
        );
    }

    /// Series `i` as a polyline of its finite points (dotted with
    /// `markers`) and its legend entry.
    fn series_and_legend(&self, svg: &mut String, frame: &Frame, i: usize, s: &Series) {
        let color = COLORS[i % COLORS.len()];
        let points: Vec<String> = s
            .points
            .iter()
            .filter(|p| p.0.is_finite() && p.1.is_finite())
            .map(|&(px, py)| format!("{:.1},{:.1}", frame.x(px), frame.y(py)))
            .collect();
        let _ = writeln!(
            svg,
            "<polyline class=\"series\" data-name=\"{}\" fill=\"none\" stroke=\"{color}\" \
             stroke-width=\"2\" points=\"{}\"/>",
            escape(&s.name),
            points.join(" ")
        );
        if self.markers {
            for p in &points {
                let (cx, cy) = p.split_once(',').expect("formatted above");
                let _ = writeln!(
                    svg,
                    "<circle cx=\"{cx}\" cy=\"{cy}\" r=\"3\" fill=\"{color}\"/>"
                );
            }
        }
        let ly = TOP + 10.0 + 18.0 * i as f64;
        let _ = writeln!(
            svg,
            "<line x1=\"{0}\" y1=\"{ly}\" x2=\"{1}\" y2=\"{ly}\" stroke=\"{color}\" stroke-width=\"2\"/>\
             <text class=\"legend\" x=\"{2}\" y=\"{3}\">{4}</text>",
            PLOT_RIGHT + 10.0,
            PLOT_RIGHT + 30.0,
            PLOT_RIGHT + 35.0,
            ly + 4.0,
            escape(&s.name)
        );
    }
}

/// A non-empty range over `values` (from `floor` if that is lower).
fn span(values: &[f64], floor: Option<f64>) -> (f64, f64) {
    let mut lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let mut hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if let Some(f) = floor {
        lo = lo.min(f);
    }
    if !lo.is_finite() || !hi.is_finite() {
        return (0.0, 1.0);
    }
    if hi - lo < 1e-12 {
        hi = lo
            + if lo.abs() > 1e-12 {
                lo.abs() * 0.1
            } else {
                1.0
            };
    }
    (lo, hi)
}

fn tick(v: f64) -> String {
    let a = v.abs();
    if a >= 1000.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_polyline_per_series_with_one_coordinate_per_point_and_labels() {
        let chart = LineChart {
            title: "t <1>".into(),
            x_label: "event time (s)".into(),
            y_label: "alpha".into(),
            series: vec![
                Series {
                    name: "node 0".into(),
                    points: vec![(0.0, 0.25), (5.0, 0.2), (10.0, f64::NAN), (15.0, 0.1)],
                },
                Series {
                    name: "node 1".into(),
                    points: vec![(0.0, 0.25)],
                },
            ],
            reference: Some((0.3, "SLO".into())),
            ..Default::default()
        };
        let svg = chart.to_svg();
        let lines: Vec<&str> = svg
            .lines()
            .filter(|l| l.contains("class=\"series\""))
            .collect();
        assert_eq!(lines.len(), 2);
        // The NaN point is left out.
        let coords = |l: &str| l.split("points=\"").nth(1).unwrap().split(' ').count();
        assert_eq!(coords(lines[0]), 3);
        assert_eq!(coords(lines[1]), 1);
        assert!(svg.contains(">event time (s)</text>") && svg.contains(">alpha</text>"));
        assert!(svg.contains("t &lt;1&gt;"), "escaped");
        assert!(svg.contains("class=\"reference\""));
        assert_eq!(svg.matches("class=\"xtick\"").count(), TICKS + 1);
    }

    #[test]
    fn an_empty_or_flat_chart_still_has_a_range() {
        assert_eq!(span(&[], None), (0.0, 1.0));
        assert_eq!(span(&[2.0, 2.0], None), (2.0, 2.2));
        assert_eq!(span(&[3.0, 5.0], Some(0.0)), (0.0, 5.0));
        let svg = LineChart::default().to_svg();
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
    }
}
