//! Builder validation, hashing and serialisation tests.
