//! Which worker reads which partition. The job assigns partitions itself
//! (no consumer-group rebalancing inside a running job): the global worker
//! `w` owns partition `p` of `topic` when `(fnv1a64(topic) + p) mod workers
//! == w`. Consecutive partitions land on consecutive workers, and the topic
//! hash staggers topics so that worker 0 does not own partition 0 of all.

/// FNV-1a, 64-bit (offset basis 0xcbf29ce484222325, prime 0x100000001b3).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    fnv1a64_extend(FNV1A64_BASIS, bytes)
}

/// FNV-1a's 64-bit offset basis: the hash of no bytes.
pub const FNV1A64_BASIS: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a of the bytes hashed to `h` so far followed by `bytes`: a value
/// hashed in pieces hashes as its bytes at once.
pub fn fnv1a64_extend(h: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(h, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The worker (0-based, of `workers`) that owns `partition` of `topic`.
///
/// # Panics
/// When `workers` is 0 or `partition` is negative (Kafka partitions are not).
pub fn partition_owner(topic: &str, partition: i32, workers: usize) -> usize {
    assert!(workers > 0, "a job has at least one worker");
    let p = u64::try_from(partition).expect("Kafka partitions are non-negative");
    (fnv1a64(topic.as_bytes()).wrapping_add(p) % workers as u64) as usize
}

/// The partitions of a topic with `partitions` partitions that `worker` reads.
pub fn owned_partitions(topic: &str, partitions: i32, worker: usize, workers: usize) -> Vec<i32> {
    (0..partitions.max(0))
        .filter(|&p| partition_owner(topic, p, workers) == worker)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_matches_published_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn every_partition_has_exactly_one_owner_and_load_is_even() {
        for workers in 1..=5 {
            for partitions in [1, 4, 7, 16] {
                let mut owned = Vec::new();
                for w in 0..workers {
                    let mine = owned_partitions("requests", partitions, w, workers);
                    let even = partitions as usize / workers;
                    assert!(
                        mine.len() == even || mine.len() == even + 1,
                        "worker {w} of {workers} owns {} of {partitions}",
                        mine.len()
                    );
                    owned.extend(mine);
                }
                owned.sort_unstable();
                assert_eq!(owned, (0..partitions).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn the_topic_hash_staggers_ownership() {
        let owners: Vec<usize> = ["a", "b", "c", "d", "e", "f"]
            .iter()
            .map(|t| partition_owner(t, 0, 4))
            .collect();
        assert!(owners.iter().any(|&w| w != owners[0]), "{owners:?}");
    }
}
