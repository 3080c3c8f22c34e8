//! End-to-end tests: antler served in-process (`antler::serve`) or as the real binary, reached
//! over real HTTP on 127.0.0.1, against the mock model in `antler_testkit::mock_model`. One test
//! binary, so the support code is compiled once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod admin;
mod agent_run;
mod api;
mod approvals;
mod chaos;
mod cli;
mod config;
mod crash;
mod discord;
mod discord_buttons;
mod feishu;
mod feishu_buttons;
mod feishu_ws;
mod first_run;
mod hardening;
mod loop_detection;
mod mcp;
mod memory;
mod memory_api;
mod memory_trust;
mod metrics;
mod model_failures;
mod opcommands;
mod ordering;
mod pairing;
mod plan_mode;
mod postgres;
mod present_files;
mod request_shaping;
mod restart;
mod sandbox;
mod seams;
mod shell;
mod skills;
mod slack;
mod slack_buttons;
mod slack_socket;
mod subagents;
mod support;
mod telegram;
mod telegram_prod;
mod telemetry;
