//! End-to-end tests: the real zergd, zergctl and zerg-worker-agent binaries, the fake agent
//! CLI, real git repositories in temp dirs and a real Unix socket.

mod attempts;
mod behaviours;
mod chaos;
mod cli;
mod container;
mod core;
mod coverage;
mod dashboard;
mod environment;
mod gates;
mod gitcore;
mod hostile;
mod kubernetes;
mod land;
mod longrun;
mod machines;
mod notify;
mod realcli;
mod remote;
mod sandbox;
mod symbols;
