//! The config loader: any TOML text (with `${VAR}` substitution from a fixed environment)
//! loads or fails with an error, never a panic; a loaded config validates again cleanly and
//! its summary renders. Also the `.env` file parser.
#![no_main]

use antler::config::Config;
use libfuzzer_sys::fuzz_target;

fn env(name: &str) -> Option<String> {
    match name {
        "ANTLER_TOKEN" => Some("secret-token".to_owned()),
        "PORT" => Some("8080".to_owned()),
        "EMPTY" => Some(String::new()),
        "FLAG" => Some("true".to_owned()),
        _ => None,
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(config) = Config::from_toml_str(text, &env) {
        assert!(config.validate().is_ok(), "loaded but does not validate");
        let _ = config.summary();
    }
    let _ = antler::fuzzing::env_file(text);
});
