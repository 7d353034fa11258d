//! Domain logic of a serving node and router, free of I/O and timely types.
