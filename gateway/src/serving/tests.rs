//! Both modes serve with the same flags, defaults and listeners.

use clap::{CommandFactory as _, Parser as _};

use super::*;
use crate::cli::{Cli, Command};

/// Every serving flag as `--help` shows it: name, environment variable, defaults.
fn serving_flags(sub: &str) -> Vec<(String, Option<String>, Vec<String>)> {
    let serve_ids: Vec<String> = <ServeArgs as clap::Args>::augment_args(clap::Command::new("x"))
        .get_arguments()
        .map(|a| a.get_id().to_string())
        .collect();
    let cli = Cli::command();
    let cmd = cli
        .find_subcommand(sub)
        .unwrap_or_else(|| panic!("no subcommand {sub}"));
    let mut flags: Vec<_> = cmd
        .get_arguments()
        .filter(|a| serve_ids.contains(&a.get_id().to_string()))
        .map(|a| {
            (
                a.get_long().unwrap_or_default().to_owned(),
                a.get_env().map(|e| e.to_string_lossy().into_owned()),
                a.get_default_values()
                    .iter()
                    .map(|v| v.to_string_lossy().into_owned())
                    .collect(),
            )
        })
        .collect();
    flags.sort();
    assert_eq!(flags.len(), serve_ids.len(), "{sub}: {flags:?}");
    flags
}

#[test]
fn run_and_controller_list_the_same_serving_flags_with_the_same_defaults() {
    let run = serving_flags("run");
    assert_eq!(run, serving_flags("controller"));
    for name in [
        "listen",
        "admin-listen",
        "grpc-listen",
        "tls-cert",
        "tls-key",
        "tls-host",
        "max-connections",
        "header-read-timeout",
        "write-timeout",
        "shutdown-timeout",
        "admin-token-file",
        "state-dir",
        "insecure-http",
    ] {
        assert!(run.iter().any(|(n, ..)| n == name), "--{name} missing");
    }
    // And `--help` shows them alike: each flag's line of the one help is in the other's.
    let help = |sub: &str| {
        let mut cli = Cli::command();
        cli.build();
        cli.find_subcommand_mut(sub)
            .map(|c| c.render_help().to_string())
            .unwrap_or_default()
    };
    let (run_help, controller_help) = (help("run"), help("controller"));
    for line in run_help.lines().filter(|l| l.contains("--max-connections")) {
        assert!(controller_help.contains(line), "{line}");
    }
}

#[test]
fn the_default_serve_args_are_the_command_lines() {
    let parsed = match Cli::try_parse_from(["floodgate", "controller"]) {
        Ok(Cli {
            command: Command::Controller(args),
            ..
        }) => args.serve,
        other => panic!("{other:?}"),
    };
    assert_eq!(parsed, ServeArgs::default());
}

/// The backlog a listening socket was given, as `ss` shows it (Send-Q of a LISTEN row);
/// `None` where `ss` is missing.
fn listen_backlog(addr: SocketAddr) -> Option<u32> {
    let out = std::process::Command::new("ss")
        .args(["-ltnH", &format!("sport = :{}", addr.port())])
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    text.split_whitespace().nth(2)?.parse().ok()
}

#[tokio::test]
async fn run_and_controller_bind_the_facade_alike() {
    let flags = [
        "--listen=127.0.0.1:0",
        "--admin-listen=127.0.0.1:0",
        "--grpc-listen=127.0.0.1:0",
        "--max-connections=7",
        "--write-timeout=3s",
    ];
    let run = Cli::try_parse_from(
        ["floodgate", "run", "--config=links.yaml"]
            .into_iter()
            .chain(flags),
    );
    let controller = Cli::try_parse_from(["floodgate", "controller"].into_iter().chain(flags));
    let (run, controller) = match (run, controller) {
        (
            Ok(Cli {
                command: Command::Run(r),
                ..
            }),
            Ok(Cli {
                command: Command::Controller(c),
                ..
            }),
        ) => (r.serve, c.serve),
        other => panic!("{other:?}"),
    };
    assert_eq!(run, controller);
    let (run, controller) = (
        run.to_config().expect("run's"),
        controller.to_config().expect("controller's"),
    );
    assert_eq!(run.limits, controller.limits);
    assert_eq!(run.limits.max_connections, 7);
    // Both modes bind through this one function; the facade gets the facade's backlog.
    let somaxconn = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    for cfg in [run, controller] {
        let listeners = bind(&cfg).await.expect("bind");
        let addr = listeners.facade.local_addr().expect("addr");
        if let (Some(backlog), Some(max)) = (listen_backlog(addr), somaxconn) {
            assert_eq!(backlog, kubeapi::serve::LISTEN_BACKLOG.min(max), "{addr}");
        }
    }
}
