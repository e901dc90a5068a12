//! The CLI's README against its `--help`: every command with each of its own flags, and the
//! exit codes with the same words, so that the README cannot fall behind the tool.

use std::collections::BTreeMap;
use std::process::Command;

/// The flags every command takes, listed once in the README's text rather than per command.
const SHARED_FLAGS: [&str; 4] = ["--url", "--prefix", "--json", "--help"];

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .args(args)
        .arg("--help")
        .env_remove("REDIS_URL")
        .output()
        .expect("run fencelock --help");
    assert!(out.status.success(), "fencelock {args:?} --help failed");
    String::from_utf8(out.stdout).expect("utf-8 help")
}

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap()
}

/// The lines of `text` after the line `heading` up to the next blank line.
fn section<'a>(text: &'a str, heading: &str) -> Vec<&'a str> {
    text.lines()
        .skip_while(|line| line.trim() != heading)
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        .collect()
}

/// The command names of the top-level help's "Commands:" section (but `help`).
fn commands() -> Vec<String> {
    section(&help(&[]), "Commands:")
        .into_iter()
        .filter(|line| line.starts_with("  ") && !line.starts_with("   "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// The long flags of a command's help, but those every command takes.
fn own_flags(command: &str) -> Vec<String> {
    section(&help(&[command]), "Options:")
        .into_iter()
        .filter_map(|line| {
            let flag = line.trim_start().trim_start_matches("-h, ");
            flag.starts_with("--")
                .then(|| flag.split_whitespace().next().unwrap().to_owned())
        })
        .filter(|flag| !SHARED_FLAGS.contains(&flag.as_str()))
        .collect()
}

/// The README's row for `fencelock <command>` in its commands table.
fn readme_row<'a>(readme: &'a str, command: &str) -> Option<&'a str> {
    let start = format!("| `fencelock {command}");
    readme.lines().find(|line| {
        line.strip_prefix(start.as_str())
            .is_some_and(|rest| rest.starts_with('`') || rest.starts_with(' '))
    })
}

#[test]
fn the_readme_lists_every_command_with_its_flags() {
    let readme = readme();
    let commands = commands();
    assert!(
        commands.len() >= 14,
        "commands read from --help: {commands:?}"
    );
    for command in &commands {
        let row = readme_row(&readme, command)
            .unwrap_or_else(|| panic!("README.md has no row for `fencelock {command}`"));
        for flag in own_flags(command) {
            assert!(
                row.contains(&format!("`{flag}")),
                "README.md's row for `fencelock {command}` does not name {flag}"
            );
        }
    }
    // And no row for a command the tool does not have.
    for line in readme.lines().filter(|l| l.starts_with("| `fencelock ")) {
        let name = line["| `fencelock ".len()..]
            .split([' ', '`'])
            .next()
            .unwrap();
        assert!(
            commands.iter().any(|c| c == name),
            "README.md lists `{name}`"
        );
    }
}

#[test]
fn the_readme_gives_the_exit_codes_of_help() {
    let mut from_help = BTreeMap::new();
    let mut last = None;
    for line in section(&help(&[]), "Exit codes:") {
        let words = line.split_whitespace().collect::<Vec<_>>().join(" ");
        match line.trim_start().split_once("  ") {
            Some((code, text)) if code.parse::<u8>().is_ok() => {
                from_help.insert(code.to_owned(), text.trim().to_owned());
                last = Some(code.to_owned());
            }
            _ => {
                let code = last.clone().expect("a continuation line after a code");
                let text: &mut String = from_help.get_mut(&code).unwrap();
                text.push(' ');
                text.push_str(&words);
            }
        }
    }
    assert_eq!(
        from_help.len(),
        8,
        "exit codes read from --help: {from_help:?}"
    );
    let readme = readme();
    let from_readme: BTreeMap<String, String> = section(&readme, "| exit code | meaning |")
        .into_iter()
        .skip(1) // the table's rule
        .map(|row| {
            let cells: Vec<&str> = row.trim_matches('|').split(" | ").map(str::trim).collect();
            (cells[0].to_owned(), cells[1].to_owned())
        })
        .collect();
    assert_eq!(
        from_readme, from_help,
        "README.md's exit codes against --help"
    );
}
