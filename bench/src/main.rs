//! `spool bench`: spool against its peers, side by side in one run.

use std::process::ExitCode;

use crate::bench::{self, BenchConfig};
use crate::out::{Result, ToolError};

pub struct Args {
    pub workloads: Vec<String>,
    pub quick: bool,
    pub json: bool,
    pub markdown: bool,
    pub dir: Option<std::path::PathBuf>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    // Scratch space on the disk being measured: --store if given, else a
    // temporary directory (removed afterwards).
    let tmp;
    let dir = match args.dir {
        Some(d) => d,
        None => {
            tmp = tempfile::Builder::new()
                .prefix("spool-bench")
                .tempdir_in(".")
                .or_else(|_| tempfile::tempdir())
                .map_err(|e| ToolError::with_source("creating a scratch directory failed", e))?;
            // The PostgreSQL peer's server runs as the `postgres` user when
            // this runs as root: it must be able to reach its directory.
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755));
            tmp.path().to_path_buf()
        }
    };
    let config = BenchConfig {
        quick: args.quick,
        workloads: args.workloads,
        dir,
    };
    let mut progress = |line: &str| eprintln!("{line}");
    let report = bench::run(&config, &bench::spool::Spool, &mut progress).map_err(|e| {
        ToolError::with_source("the benchmark failed", e).hint(
            "workloads: append-durable, append-buffered, open, page, list, fork (or `append`)",
        )
    })?;
    if args.json {
        crate::outln!("{}", bench::report::to_json(&report));
    }
    if args.markdown {
        crate::outln!("{}", bench::report::to_markdown(&report));
    }
    if !args.json && !args.markdown {
        crate::outln!("{}", bench::report::to_markdown(&report));
    }
    Ok(ExitCode::SUCCESS)
}
