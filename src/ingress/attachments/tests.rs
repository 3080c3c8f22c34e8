use std::collections::VecDeque;
use std::sync::Mutex;

use antler_channel::{OutboundMessage, Parsed, Part, Receipt, WebhookRequest};

use super::*;

const MIB: u64 = 1024 * 1024;

/// What the fake platform does on one download.
#[derive(Debug)]
enum Outcome {
    Bytes(Vec<u8>),
    Fail(ChannelError),
    /// Never answers.
    Hang,
}

/// A channel whose downloads follow a script; it records the cap each call was given.
#[derive(Debug, Default)]
struct FakeChannel {
    script: Mutex<VecDeque<Outcome>>,
    caps: Mutex<Vec<u64>>,
}

impl FakeChannel {
    fn scripted(outcomes: impl IntoIterator<Item = Outcome>) -> Self {
        Self {
            script: Mutex::new(outcomes.into_iter().collect()),
            caps: Mutex::default(),
        }
    }

    fn calls(&self) -> usize {
        self.caps.lock().unwrap().len()
    }
}

#[async_trait::async_trait]
impl Channel for FakeChannel {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn verify(&self, _: &WebhookRequest<'_>) -> Result<(), ChannelError> {
        Ok(())
    }

    fn parse(&self, _: &WebhookRequest<'_>) -> Result<Parsed, ChannelError> {
        Ok(Parsed::Ignore)
    }

    async fn send(&self, _: &OutboundMessage, _: Part<'_>) -> Result<Receipt, ChannelError> {
        Err(ChannelError::Unsupported)
    }

    async fn fetch_attachment(
        &self,
        _: &AttachmentRef,
        max_bytes: u64,
    ) -> Result<Vec<u8>, ChannelError> {
        self.caps.lock().unwrap().push(max_bytes);
        let next = self.script.lock().unwrap().pop_front();
        match next {
            Some(Outcome::Bytes(bytes)) => Ok(bytes),
            Some(Outcome::Fail(error)) => Err(error),
            Some(Outcome::Hang) => std::future::pending().await,
            None => panic!("more downloads than scripted"),
        }
    }
}

/// A channel without the fetch capability (the trait's default).
#[derive(Debug)]
struct NoFetch;

#[async_trait::async_trait]
impl Channel for NoFetch {
    fn name(&self) -> &'static str {
        "nofetch"
    }

    fn verify(&self, _: &WebhookRequest<'_>) -> Result<(), ChannelError> {
        Ok(())
    }

    fn parse(&self, _: &WebhookRequest<'_>) -> Result<Parsed, ChannelError> {
        Ok(Parsed::Ignore)
    }

    async fn send(&self, _: &OutboundMessage, _: Part<'_>) -> Result<Receipt, ChannelError> {
        Err(ChannelError::Unsupported)
    }
}

fn inline(name: &str, bytes: &[u8]) -> AttachmentRef {
    AttachmentRef {
        name: name.to_owned(),
        media_type: Some("text/plain".to_owned()),
        size: Some(len_u64(bytes)),
        source: AttachmentSource::Inline {
            data_base64: base64::engine::general_purpose::STANDARD.encode(bytes),
        },
    }
}

fn platform(name: &str, size: Option<u64>) -> AttachmentRef {
    AttachmentRef {
        name: name.to_owned(),
        media_type: Some("application/zip".to_owned()),
        size,
        source: AttachmentSource::Platform {
            id: "file-1".to_owned(),
        },
    }
}

struct Thread {
    _dir: tempfile::TempDir,
    folders: ThreadFolders,
}

fn thread() -> Thread {
    let dir = tempfile::tempdir().unwrap();
    let folders = ThreadFolders::new(dir.path(), "t1").unwrap();
    Thread { _dir: dir, folders }
}

/// The names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn inline_files_are_decoded_into_uploads_owner_only() {
    let t = thread();
    let refs = [inline("notes.txt", b"hello file")];
    let stored = fetch_attachments(None, &refs, &t.folders, MIB)
        .await
        .unwrap();
    assert_eq!(stored.len(), 1);
    let file = &stored[0];
    assert_eq!(file.name, "notes.txt");
    assert_eq!(file.size, 10);
    assert_eq!(file.media_type.as_deref(), Some("text/plain"));
    assert_eq!(file.path, t.folders.uploads().join("notes.txt"));
    assert_eq!(std::fs::read(&file.path).unwrap(), b"hello file");
    assert!(t.folders.workspace().is_dir(), "the folders were created");
    assert!(t.folders.outputs().is_dir());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file.path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    assert_eq!(
        listing(&t.folders.uploads()),
        ["notes.txt"],
        "no temporary left"
    );
}

#[tokio::test]
async fn platform_files_are_fetched_through_the_channel_with_the_cap() {
    let t = thread();
    let channel = FakeChannel::scripted([Outcome::Bytes(b"PK zip bytes".to_vec())]);
    let refs = [platform("archive.zip", Some(12))];
    let stored = fetch_attachments(Some(&channel), &refs, &t.folders, 5 * MIB)
        .await
        .unwrap();
    assert_eq!(*channel.caps.lock().unwrap(), [5 * MIB]);
    assert_eq!(stored[0].name, "archive.zip");
    assert_eq!(stored[0].size, 12);
    assert_eq!(stored[0].media_type.as_deref(), Some("application/zip"));
    assert_eq!(std::fs::read(&stored[0].path).unwrap(), b"PK zip bytes");
}

#[tokio::test]
async fn a_declared_size_over_the_cap_is_refused_without_downloading() {
    let t = thread();
    let channel = FakeChannel::default();
    let declared = 32_925_287; // 31.4 MiB
    let refs = [platform("big.zip", Some(declared))];
    let error = fetch_attachments(Some(&channel), &refs, &t.folders, 20 * MIB)
        .await
        .unwrap_err();
    assert!(
        matches!(&error, AttachmentError::TooLarge { size: Some(s), limit, .. } if *s == declared && *limit == 20 * MIB),
        "{error:?}"
    );
    assert_eq!(channel.calls(), 0);
    assert_eq!(
        error.user_message(),
        "⚠️ `big.zip` is 31.4 MB; antler accepts files up to 20 MB. Send a smaller file."
    );
    assert!(listing(&t.folders.uploads()).is_empty());
}

#[tokio::test]
async fn more_bytes_than_declared_are_refused_and_not_stored() {
    let t = thread();
    // The platform says 10 bytes and sends 101.
    let channel = FakeChannel::scripted([Outcome::Bytes(vec![7; 101])]);
    let refs = [platform("liar.bin", Some(10))];
    let error = fetch_attachments(Some(&channel), &refs, &t.folders, 100)
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            AttachmentError::TooLarge {
                size: Some(101),
                limit: 100,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(listing(&t.folders.uploads()).is_empty());
}

#[tokio::test]
async fn the_platforms_own_too_large_is_reported_without_a_size() {
    let t = thread();
    let channel = FakeChannel::scripted([Outcome::Fail(ChannelError::TooLarge { limit: 2048 })]);
    let refs = [platform("huge.iso", None)];
    let error = fetch_attachments(Some(&channel), &refs, &t.folders, 2048)
        .await
        .unwrap_err();
    assert!(
        matches!(error, AttachmentError::TooLarge { size: None, .. }),
        "{error:?}"
    );
    assert_eq!(channel.calls(), 1, "not retried");
    assert_eq!(
        error.user_message(),
        "⚠️ `huge.iso` is larger than the 2 KB antler accepts. Send a smaller file."
    );
}

#[tokio::test]
async fn inline_data_over_the_cap_or_not_base64_is_refused() {
    let t = thread();
    let refs = [inline("a.txt", &[1; 50])];
    let error = fetch_attachments(None, &refs, &t.folders, 49)
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            AttachmentError::TooLarge {
                size: Some(50),
                limit: 49,
                ..
            }
        ),
        "{error:?}"
    );

    let mut bad = inline("b.txt", b"abc");
    bad.source = AttachmentSource::Inline {
        data_base64: "not base64!".to_owned(),
    };
    let error = fetch_attachments(None, &[bad], &t.folders, 49)
        .await
        .unwrap_err();
    assert!(
        matches!(&error, AttachmentError::Invalid { name } if name == "b.txt"),
        "{error:?}"
    );
    assert!(listing(&t.folders.uploads()).is_empty());
}

#[tokio::test]
async fn a_channel_that_cannot_fetch_is_unsupported() {
    let t = thread();
    let refs = [platform("doc.pdf", Some(10))];
    let error = fetch_attachments(Some(&NoFetch), &refs, &t.folders, MIB)
        .await
        .unwrap_err();
    assert!(
        matches!(&error, AttachmentError::Unsupported { name } if name == "doc.pdf"),
        "{error:?}"
    );
    assert!(
        error
            .user_message()
            .contains("this channel cannot fetch files"),
        "{}",
        error.user_message()
    );
    // No channel at all: the same.
    let error = fetch_attachments(None, &refs, &t.folders, MIB)
        .await
        .unwrap_err();
    assert!(
        matches!(error, AttachmentError::Unsupported { .. }),
        "{error:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn transient_failures_and_rate_limits_are_retried() {
    let t = thread();
    let channel = FakeChannel::scripted([
        Outcome::Fail(ChannelError::Transient("502 from upstream".to_owned())),
        Outcome::Fail(ChannelError::RateLimited {
            retry_after: Duration::from_secs(7),
        }),
        Outcome::Bytes(b"third time".to_vec()),
    ]);
    let refs = [platform("r.txt", None)];
    let started = Instant::now();
    let stored = fetch_attachments(Some(&channel), &refs, &t.folders, MIB)
        .await
        .unwrap();
    assert_eq!(channel.calls(), 3);
    assert_eq!(std::fs::read(&stored[0].path).unwrap(), b"third time");
    // (Paused time: the clock moves only by the waits antler asked for.)
    assert!(
        started.elapsed() >= Duration::from_secs(7),
        "the platform's retry_after was honoured: {:?}",
        started.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn failures_end_after_a_few_attempts_with_no_platform_text_for_the_user() {
    let t = thread();
    let channel = FakeChannel::scripted(
        (0..10).map(|_| Outcome::Fail(ChannelError::Transient("upstream said: hunter2".into()))),
    );
    let refs = [platform("x.log", None)];
    let error = fetch_attachments(Some(&channel), &refs, &t.folders, MIB)
        .await
        .unwrap_err();
    assert_eq!(channel.calls(), FETCH_RETRY.max_attempts as usize);
    assert!(
        matches!(&error, AttachmentError::Fetch { name, .. } if name == "x.log"),
        "{error:?}"
    );
    let message = error.user_message();
    assert_eq!(
        message,
        "⚠️ could not download `x.log` (the platform failed); send it again."
    );
    assert!(!message.contains("hunter2"));
}

#[tokio::test(start_paused = true)]
async fn permanent_failures_and_long_rate_limits_are_not_retried() {
    let t = thread();
    let channel = FakeChannel::scripted([Outcome::Fail(ChannelError::Permanent(
        "404 file expired".to_owned(),
    ))]);
    let refs = [platform("gone.txt", None)];
    let error = fetch_attachments(Some(&channel), &refs, &t.folders, MIB)
        .await
        .unwrap_err();
    assert!(matches!(error, AttachmentError::Fetch { .. }), "{error:?}");
    assert_eq!(channel.calls(), 1);

    // A wait past the time budget is not waited out.
    let channel = FakeChannel::scripted([Outcome::Fail(ChannelError::RateLimited {
        retry_after: FETCH_BUDGET * 2,
    })]);
    let started = Instant::now();
    let error = fetch_attachments(Some(&channel), &refs, &t.folders, MIB)
        .await
        .unwrap_err();
    assert_eq!(channel.calls(), 1);
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(
        error.user_message().contains("slow down"),
        "{}",
        error.user_message()
    );
}

#[tokio::test(start_paused = true)]
async fn a_platform_that_never_answers_is_given_up_within_the_budget() {
    let t = thread();
    let channel = FakeChannel::scripted((0..10).map(|_| Outcome::Hang));
    let refs = [platform("slow.bin", None)];
    let started = Instant::now();
    let error = fetch_attachments(Some(&channel), &refs, &t.folders, MIB)
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            AttachmentError::Fetch {
                source: ChannelError::Transient(_),
                ..
            }
        ),
        "{error:?}"
    );
    assert!(channel.calls() >= 2, "a timed-out attempt is retried");
    assert!(
        started.elapsed() <= FETCH_BUDGET + Duration::from_secs(1),
        "bounded: {:?}",
        started.elapsed()
    );
}

#[test]
fn names_are_made_safe() {
    let cases = [
        ("report.pdf", "report.pdf"),
        ("../../etc/passwd", "passwd"),
        ("..\\..\\windows\\system.ini", "system.ini"),
        ("C:\\Users\\ana\\Q3 plan.xlsx", "Q3 plan.xlsx"),
        ("dir/", "dir"),
        ("con\u{0}trol", "control"),
        ("line\nbreak\t.txt", "linebreak.txt"),
        (".env", "env"),
        ("...hidden", "hidden"),
        ("  spaced.txt  ", "spaced.txt"),
        ("trailing.", "trailing"),
        // U+202E (right-to-left override) would make `invoice<RLO>fdp.exe` read `invoiceexe.pdf`.
        ("invoice\u{202E}fdp.exe", "invoicefdp.exe"),
        ("zero\u{200B}width", "zerowidth"),
        ("a`b*c?.txt", "a_b_c_.txt"),
        ("résumé.pdf", "résumé.pdf"),
    ];
    for (raw, safe) in cases {
        assert_eq!(safe_file_name(raw).as_deref(), Some(safe), "{raw:?}");
    }
    for nothing in [
        "",
        "   ",
        ".",
        "..",
        "../..",
        "/",
        "\\",
        "\u{0}\u{1}",
        "...",
        "a/..",
    ] {
        assert_eq!(safe_file_name(nothing), None, "{nothing:?}");
    }
}

#[test]
fn long_names_are_shortened_keeping_the_extension() {
    let long = format!("{}.pdf", "x".repeat(300));
    let safe = safe_file_name(&long).unwrap();
    assert_eq!(safe.len(), MAX_NAME_BYTES);
    assert!(safe.ends_with("x.pdf"), "{safe}");

    let accented = format!("{}.txt", "é".repeat(200));
    let safe = safe_file_name(&accented).unwrap();
    assert!(safe.len() <= MAX_NAME_BYTES);
    assert!(safe.ends_with("é.txt"), "{safe}");

    let bare = "y".repeat(400);
    assert_eq!(safe_file_name(&bare).unwrap(), "y".repeat(MAX_NAME_BYTES));

    // An "extension" too long to be one is cut like the rest.
    let odd = format!("a.{}", "z".repeat(300));
    assert_eq!(safe_file_name(&odd).unwrap().len(), MAX_NAME_BYTES);
}

#[test]
fn numbered_names_keep_the_extension() {
    assert_eq!(numbered("a.txt", 1), "a.txt");
    assert_eq!(numbered("a.txt", 2), "a (2).txt");
    assert_eq!(numbered("README", 3), "README (3)");
    assert_eq!(numbered("archive.tar.gz", 2), "archive.tar (2).gz");
}

#[tokio::test]
async fn dangerous_names_stay_inside_uploads_and_empty_ones_become_file() {
    let t = thread();
    let refs = [
        inline("../../etc/passwd", b"root"),
        inline("..", b"dots"),
        inline(".env", b"SECRET=1"),
    ];
    let stored = fetch_attachments(None, &refs, &t.folders, MIB)
        .await
        .unwrap();
    let names: Vec<&str> = stored.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["passwd", "file", "env"]);
    for file in &stored {
        assert_eq!(file.path.parent(), Some(t.folders.uploads().as_path()));
    }
    assert_eq!(listing(&t.folders.uploads()), ["env", "file", "passwd"]);
    assert_eq!(
        listing(t.folders.root()),
        ["outputs", "tmp", "uploads", "workspace"],
        "nothing was written beside the folders"
    );
}

#[tokio::test]
async fn a_rerun_reuses_its_files_and_a_different_file_gets_a_number() {
    let t = thread();
    let refs = [
        inline("report.pdf", b"version one"),
        inline("report.pdf", b"version two"),
    ];
    let first = fetch_attachments(None, &refs, &t.folders, MIB)
        .await
        .unwrap();
    assert_eq!(first[0].name, "report.pdf");
    assert_eq!(first[1].name, "report (2).pdf");
    assert_eq!(std::fs::read(&first[1].path).unwrap(), b"version two");

    // The turn runs again after a crash: the same files, nothing new.
    let again = fetch_attachments(None, &refs, &t.folders, MIB)
        .await
        .unwrap();
    assert_eq!(again, first);
    assert_eq!(
        listing(&t.folders.uploads()),
        ["report (2).pdf", "report.pdf"]
    );

    // A later message with a third version of the same name.
    let later = fetch_attachments(
        None,
        &[inline("report.pdf", b"version three")],
        &t.folders,
        MIB,
    )
    .await
    .unwrap();
    assert_eq!(later[0].name, "report (3).pdf");
    assert_eq!(std::fs::read(&first[0].path).unwrap(), b"version one");
}

#[cfg(unix)]
#[tokio::test]
async fn links_in_uploads_are_never_followed() {
    let t = thread();
    t.folders.create().await.unwrap();
    let outside = t.folders.root().join("outside.txt");
    std::fs::write(&outside, b"keep me").unwrap();
    let uploads = t.folders.uploads();
    // A link under the file's name, and one under its temporary name.
    std::os::unix::fs::symlink(&outside, uploads.join("a.txt")).unwrap();
    std::os::unix::fs::symlink(&outside, uploads.join(".a (2).txt.part")).unwrap();

    let stored = fetch_attachments(None, &[inline("a.txt", b"new")], &t.folders, MIB)
        .await
        .unwrap();
    assert_eq!(stored[0].name, "a (2).txt");
    assert_eq!(std::fs::read(&stored[0].path).unwrap(), b"new");
    assert_eq!(std::fs::read(&outside).unwrap(), b"keep me");
    // Nothing of the write is left behind; the planted links stay links, never written through.
    assert_eq!(listing(&uploads), [".a (2).txt.part", "a (2).txt", "a.txt"]);
    for planted in ["a.txt", ".a (2).txt.part"] {
        let meta = std::fs::symlink_metadata(uploads.join(planted)).unwrap();
        assert!(meta.file_type().is_symlink(), "{planted}");
    }
}

#[test]
fn inline_decoding_is_strict_and_bounded() {
    assert_eq!(decode_inline("aGk=", 10).unwrap(), b"hi");
    assert_eq!(decode_inline("", 10).unwrap(), b"");
    for bad in ["aGk", "aG k=", "aGk=\n", "a*k=", "aGk==="] {
        assert_eq!(
            decode_inline(bad, 10),
            Err(InlineError::NotBase64),
            "{bad:?}"
        );
    }
    assert_eq!(
        decode_inline("aGk=", 1),
        Err(InlineError::TooLarge { size: 2, limit: 1 })
    );
    // Far over the cap: refused by its length (even though it is not base64 at all).
    let huge = "!".repeat(4000);
    assert!(matches!(
        decode_inline(&huge, 100),
        Err(InlineError::TooLarge { size: 3000, .. })
    ));
}

#[test]
fn media_types_are_kept_only_when_plausible() {
    assert_eq!(
        clean_media_type(Some("image/png")).as_deref(),
        Some("image/png")
    );
    assert_eq!(
        clean_media_type(Some("text/plain; charset=utf-8")).as_deref(),
        Some("text/plain; charset=utf-8")
    );
    for bad in ["png", "", "text/\u{0}plain", "image/pngé"] {
        assert_eq!(clean_media_type(Some(bad)), None, "{bad:?}");
    }
    assert_eq!(
        clean_media_type(Some(&format!("a/{}", "b".repeat(200)))),
        None
    );
    assert_eq!(clean_media_type(None), None);
}
