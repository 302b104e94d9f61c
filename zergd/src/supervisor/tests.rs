//! Tests of the rush state machine (being written).
