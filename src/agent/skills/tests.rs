use std::path::Path;

use super::*;

fn skill_md(name: &str, description: &str, extra: &str) -> String {
    format!("---\nname: {name}\ndescription: {description}\n{extra}---\n\n# Instructions\n")
}

fn write_skill(root: &Path, folder: &str, text: &str) {
    std::fs::create_dir_all(root.join(folder)).unwrap();
    std::fs::write(root.join(folder).join("SKILL.md"), text).unwrap();
}

fn config(paths: &[&Path]) -> SkillsConfig {
    SkillsConfig {
        paths: paths.iter().map(|p| p.to_path_buf()).collect(),
        ..SkillsConfig::default()
    }
}

#[test]
fn front_matter_is_read_with_both_forms_of_allowed_tools() {
    let skill = parse(
        &skill_md(
            "log-reader",
            "Reads logs.\n  Then summarises.",
            "allowed-tools: read_file, bash  mcp__logs__*\nlicense: MIT\nmetadata:\n  owner: sre\n",
        ),
        "log-reader",
    )
    .unwrap();
    assert_eq!(skill.name, "log-reader");
    assert_eq!(skill.description, "Reads logs. Then summarises.");
    assert_eq!(
        skill.allowed_tools,
        Some(vec![
            "read_file".into(),
            "bash".into(),
            "mcp__logs__*".into()
        ])
    );
    assert_eq!(skill.license.as_deref(), Some("MIT"));
    let listed = parse(
        &skill_md("x", "d", "allowed-tools:\n  - ls\n  - read_file\n"),
        "x",
    )
    .unwrap();
    assert_eq!(
        listed.allowed_tools,
        Some(vec!["ls".into(), "read_file".into()])
    );
    assert_eq!(
        parse(&skill_md("x", "d", ""), "x").unwrap().allowed_tools,
        None
    );
    // A byte-order mark and CRLF line ends are fine.
    let crlf = "\u{feff}---\r\nname: x\r\ndescription: d\r\n---\r\nbody\r\n";
    assert_eq!(parse(crlf, "x").unwrap().description, "d");
}

#[test]
fn invalid_front_matter_is_refused_with_the_reason() {
    let long = "d".repeat(MAX_DESCRIPTION_CHARS + 1);
    let many = format!("allowed-tools: {}\n", vec!["t"; 65].join(" "));
    let cases: Vec<(String, &str, &str)> = vec![
        (
            "# no front matter\n".to_owned(),
            "x",
            "must start with YAML front matter",
        ),
        (
            "---\nname: x\ndescription: d\n".to_owned(),
            "x",
            "no closing",
        ),
        ("---\nname: [x\n---\n".to_owned(), "x", "not valid YAML"),
        (
            skill_md("x", "d", "").replace("name: x\n", ""),
            "x",
            "no `name`",
        ),
        ("---\nname: x\n---\n".to_owned(), "x", "no `description`"),
        (
            skill_md("Bad_Name", "d", ""),
            "Bad_Name",
            "not a skill name",
        ),
        (skill_md("a--b", "d", ""), "a--b", "not a skill name"),
        (skill_md("-a", "d", ""), "-a", "not a skill name"),
        (skill_md(&"a".repeat(65), "d", ""), "a", "not a skill name"),
        (skill_md("other", "d", ""), "x", "not its folder's name"),
        (skill_md("x", &long, ""), "x", "longer than 1024"),
        (
            skill_md("x", "d", "allowed-tools: \"rm -rf\" `x`\n"),
            "x",
            "not valid YAML",
        ),
        (
            skill_md("x", "d", "allowed-tools: [\"a b\"]\n"),
            "x",
            "not a tool name",
        ),
        (skill_md("x", "d", &many), "x", "more than 64 tools"),
    ];
    for (text, folder, reason) in cases {
        let error = parse(&text, folder).unwrap_err();
        assert!(error.contains(reason), "{text:?}: {error}");
    }
}

#[test]
fn folders_default_beside_the_config_file() {
    let mut cfg = SkillsConfig {
        base: PathBuf::from("/etc/antler"),
        ..SkillsConfig::default()
    };
    assert_eq!(
        cfg.folders(),
        [
            (PathBuf::from("/etc/antler/skills/public"), false),
            (PathBuf::from("/etc/antler/skills/custom"), false)
        ]
    );
    cfg.paths = vec![PathBuf::from("mine"), PathBuf::from("/srv/skills")];
    assert_eq!(
        cfg.folders(),
        [
            (PathBuf::from("/etc/antler/mine"), true),
            (PathBuf::from("/srv/skills"), true)
        ]
    );
}

#[cfg(unix)]
#[test]
fn loading_reports_invalid_skills_and_links_and_keeps_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let public = dir.path().join("public");
    let custom = dir.path().join("custom");
    write_skill(&public, "good", &skill_md("good", "Good one", ""));
    write_skill(&public, "broken", "no front matter");
    write_skill(&public, "linked", &skill_md("linked", "Has a link", ""));
    std::os::unix::fs::symlink("/etc/passwd", public.join("linked/passwd")).unwrap();
    write_skill(&public, "big", &"x".repeat(MAX_SKILL_MD_BYTES as usize + 1));
    std::os::unix::fs::symlink(public.join("good"), public.join("alias")).unwrap();
    std::fs::write(public.join("README.md"), "not a skill").unwrap();
    write_skill(&custom, "good", &skill_md("good", "A second good", ""));
    write_skill(&custom, "mine", &skill_md("mine", "Mine", ""));
    std::fs::create_dir_all(public.join("md-link")).unwrap();
    std::os::unix::fs::symlink(
        public.join("good/SKILL.md"),
        public.join("md-link/SKILL.md"),
    )
    .unwrap();

    let catalogue = load(&config(&[&public, &custom]));
    assert_eq!(
        catalogue.skills.keys().collect::<Vec<_>>(),
        ["good", "mine"]
    );
    assert_eq!(catalogue.skills["good"].description, "Good one");
    assert_eq!(catalogue.skills["good"].folder, public.join("good"));
    let reasons: Vec<String> = catalogue.invalid.iter().map(ToString::to_string).collect();
    let has = |file: &str, reason: &str| {
        assert!(
            reasons
                .iter()
                .any(|r| r.contains(file) && r.contains(reason)),
            "{file}: {reason} not in {reasons:#?}"
        );
    };
    has("public/broken/SKILL.md", "front matter");
    has("public/linked/SKILL.md", "passwd is a symbolic link");
    has("public/big/SKILL.md", "65537 bytes");
    has("public/alias", "symbolic link");
    has("public/md-link/SKILL.md", "symbolic link");
    has("custom/good/SKILL.md", "already loaded");
    assert_eq!(reasons.len(), 6, "{reasons:#?}");

    // A named folder that is missing is reported; the default ones may be missing.
    let missing = load(&config(&[&dir.path().join("nope")]));
    assert!(missing.skills.is_empty());
    assert!(
        missing.invalid[0].reason.contains("cannot open"),
        "{:?}",
        missing.invalid
    );
    let defaults = load(&SkillsConfig {
        base: dir.path().join("nothing-here"),
        ..SkillsConfig::default()
    });
    assert_eq!(defaults, Catalogue::default());
    // Off: nothing is read.
    let off = load(&SkillsConfig {
        enabled: false,
        ..config(&[&public])
    });
    assert!(off.skills.is_empty() && off.invalid.is_empty());
}

#[test]
fn the_number_of_skills_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    for index in 0..=MAX_SKILLS {
        let name = format!("s{index:03}");
        write_skill(dir.path(), &name, &skill_md(&name, "d", ""));
    }
    let catalogue = load(&config(&[dir.path()]));
    assert_eq!(catalogue.skills.len(), MAX_SKILLS);
    assert_eq!(catalogue.invalid.len(), 1);
    assert!(catalogue.invalid[0].reason.contains("at most 100"));
}

#[test]
fn the_shipped_skills_are_valid() {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/skills/public");
    let catalogue = load(&config(&[&shipped]));
    assert!(catalogue.invalid.is_empty(), "{:?}", catalogue.invalid);
    assert_eq!(
        catalogue.skills.keys().collect::<Vec<_>>(),
        ["incident-summary", "postmortem"]
    );
    let incident = &catalogue.skills["incident-summary"];
    assert!(
        incident.allowed_tools.as_ref().is_some_and(
            |t| t.contains(&"mcp__*".to_owned()) && t.contains(&"read_file".to_owned())
        ),
        "{incident:?}"
    );
    let postmortem = &catalogue.skills["postmortem"];
    assert_eq!(
        postmortem.allowed_tools.as_deref(),
        Some(
            &[
                "read_file",
                "ls",
                "write_file",
                "present_files",
                "ask_clarification"
            ]
            .map(str::to_owned)[..]
        )
    );
    // The mounts name their files the way the model reads them.
    let mounts = catalogue.mounts(&BTreeMap::from([("postmortem".to_owned(), false)]));
    assert!(mounts.get("postmortem").is_none());
    let path = mounts
        .resolve("/mnt/skills/incident-summary/reference/log-patterns.md")
        .unwrap()
        .unwrap();
    let opened = mounts
        .open(&path)
        .unwrap()
        .open_file(&path.relative, 1 << 20)
        .unwrap();
    assert!(opened.size > 0);
}

#[test]
fn mounts_resolve_only_enabled_skills_inside_their_folders() {
    let mut catalogue = Catalogue::default();
    catalogue.skills.insert(
        "a".to_owned(),
        Skill {
            name: "a".to_owned(),
            description: "d".to_owned(),
            allowed_tools: None,
            license: None,
            folder: PathBuf::from("/srv/skills/a"),
        },
    );
    let mounts = catalogue.mounts(&BTreeMap::new());
    assert_eq!(mounts.resolve("/mnt/skills").unwrap(), None);
    assert_eq!(mounts.resolve("/mnt/skills/").unwrap(), None);
    let resolved = mounts.resolve(" /mnt/skills/a/./x/y.md").unwrap().unwrap();
    assert_eq!(resolved.skill, "a");
    assert_eq!(resolved.relative, PathBuf::from("x/y.md"));
    assert_eq!(resolved.virtual_path, "/mnt/skills/a/x/y.md");
    assert!(matches!(
        mounts.resolve("/mnt/skills/a/../b"),
        Err(mounts::SkillPathError::Outside(_))
    ));
    assert!(matches!(
        mounts.resolve("/mnt/skills/b/SKILL.md"),
        Err(mounts::SkillPathError::Unknown(_))
    ));
    assert!(!SkillMounts::is_skill_path("/mnt/skillsX/a"));
    assert!(SkillMounts::is_skill_path("/mnt/skills/a"));
    assert_eq!(
        mounts.host_pairs(),
        [("/mnt/skills/a".to_owned(), "/srv/skills/a".to_owned())]
    );
    let off = catalogue.mounts(&BTreeMap::from([("a".to_owned(), false)]));
    assert!(off.is_empty());
    assert!(off.listing().contains("no skill is on"));
}
