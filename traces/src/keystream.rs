//! Key streams of real traces for cache benchmarks (owned by the cache work).
