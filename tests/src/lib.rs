//! Support code for zerg's end-to-end tests.
