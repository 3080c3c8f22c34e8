//! Quantities shown to people: [`human_size`]. A leaf every module may use, so that a size
//! reads the same in an upload list, a refusal and a delivery note.

/// `bytes` for people: `512 bytes`, `3.5 KB`, `31.4 MB`, `20 MB` (binary units, one decimal
/// unless whole).
pub(crate) fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KB", "MB", "GB", "TB"];
    if bytes < 1024 {
        return if bytes == 1 {
            "1 byte".to_owned()
        } else {
            format!("{bytes} bytes")
        };
    }
    // One decimal is shown; f64 is exact far beyond that.
    let mut value = bytes as f64;
    let mut unit = "";
    for name in UNITS {
        value /= 1024.0;
        unit = name;
        if value < 1024.0 {
            break;
        }
    }
    let rounded = (value * 10.0).round() / 10.0;
    if rounded.fract() == 0.0 {
        format!("{rounded:.0} {unit}")
    } else {
        format!("{rounded:.1} {unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    #[test]
    fn sizes_read_like_people_write_them() {
        assert_eq!(human_size(0), "0 bytes");
        assert_eq!(human_size(1), "1 byte");
        assert_eq!(human_size(1023), "1023 bytes");
        assert_eq!(human_size(1536), "1.5 KB");
        assert_eq!(human_size(20 * MIB), "20 MB");
        assert_eq!(human_size(32_925_287), "31.4 MB");
        assert_eq!(human_size(3 * 1024 * MIB), "3 GB");
    }
}
