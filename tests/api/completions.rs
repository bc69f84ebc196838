//! The generated completion scripts, run in the real shells: a second- and third-level word
//! completes (bash did not: clap_complete spells its states two ways for a hyphenated binary).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::requires;

fn script(dir: &Path, shell: &str) -> PathBuf {
    let out = Command::new(env!("CARGO_BIN_EXE_webhook-inbox"))
        .args(["completions", shell])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = dir.join(format!("webhook-inbox.{shell}"));
    std::fs::write(&path, out.stdout).unwrap();
    path
}

/// What Tab offers in bash after `words` (the last one being typed), as bash itself computes
/// it: the function that `complete -p` names, called with COMP_WORDS and COMP_CWORD set.
fn bash_offers(script: &Path, words: &[&str]) -> Vec<String> {
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let program = format!(
        r#"source '{script}'
fn=$(complete -p webhook-inbox | sed -E 's/.*-F ([^ ]+).*/\1/')
COMP_WORDS=({words})
COMP_CWORD={cword}
COMP_LINE="${{COMP_WORDS[*]}}"
COMP_POINT=${{#COMP_LINE}}
"$fn" webhook-inbox '{cur}' '{prev}'
printf '%s\n' "${{COMPREPLY[@]}}""#,
        script = script.display(),
        words = quoted.join(" "),
        cword = words.len() - 1,
        cur = words[words.len() - 1],
        prev = words[words.len() - 2],
    );
    let out = Command::new("bash")
        .args(["--norc", "--noprofile", "-c", &program])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn bash_completes_past_the_first_word() {
    let dir = tempfile::tempdir().unwrap();
    let script = script(dir.path(), "bash");
    let top = bash_offers(&script, &["webhook-inbox", ""]);
    assert!(top.contains(&"events".to_string()), "{top:?}");
    let second = bash_offers(&script, &["webhook-inbox", "events", ""]);
    for sub in ["list", "show", "retry", "export", "purge"] {
        assert!(
            second.contains(&sub.to_string()),
            "events <Tab>: {second:?}"
        );
    }
    let third = bash_offers(&script, &["webhook-inbox", "events", "retry", "--"]);
    for flag in ["--failed", "--force", "--source"] {
        assert!(
            third.contains(&flag.to_string()),
            "events retry --<Tab>: {third:?}"
        );
    }
}

#[test]
fn fish_completes_past_the_first_word() {
    let found = requires::command("fish");
    if !requires::available("fish", found) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = script(dir.path(), "fish");
    let offers = |line: &str| -> Vec<String> {
        let program = format!("source '{}'; complete -C '{line}'", script.display());
        let out = Command::new("fish")
            .args(["-c", &program])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.split('\t').next().unwrap().to_string())
            .collect()
    };
    let second = offers("webhook-inbox events ");
    assert!(second.contains(&"retry".to_string()), "{second:?}");
    let third = offers("webhook-inbox events retry --");
    assert!(third.contains(&"--failed".to_string()), "{third:?}");
}
