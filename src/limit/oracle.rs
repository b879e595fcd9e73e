//! An exact sliding-log limiter and property tests of [`super::Runs`] against it.
