//! `outbox --help` and every subcommand's help.

use crate::support::run;

#[tokio::test]
async fn help_works_on_every_subcommand() {
    let top = run(["--help"]).await;
    top.expect_code(0);
    // the subcommands, as the help lists them
    let mut commands: Vec<String> = top
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .filter(|c| c != "help")
        .collect();
    for expected in [
        "migrate", "relay", "status", "check", "lock", "gen", "asyncapi", "tail", "unblock",
        "prune", "stream",
    ] {
        assert!(
            commands.iter().any(|c| c == expected),
            "`outbox --help` does not list `{expected}`:\n{}",
            top.stdout
        );
    }
    commands.push("stream ensure".into());
    for command in &commands {
        let mut args: Vec<&str> = command.split(' ').collect();
        args.push("--help");
        let out = run(&args).await;
        out.expect_code(0);
        assert!(
            out.stdout.contains(&format!("Usage: outbox {command}")),
            "`outbox {command} --help` shows no usage:\n{}",
            out.stdout
        );
    }
}
