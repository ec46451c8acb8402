//! Command-line definitions.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

/// spool: an embedded, event-sourced store for AI-agent sessions.
///
/// Every command works on the store directory given with `--store`; demo,
/// sessions, show, tree, context, delete, purge, stats, export and import also
/// work on a PostgreSQL store (`--store postgres://…`), and the others refuse a URL. A session
/// id argument may be a unique prefix of the id (at least 4 characters).
/// Commands that print data print aligned text by default and one JSON
/// document with `--json`. Exit codes: 0 success, 1 a check found a problem
/// (e.g. `verify` found corruption), 2 the command failed, 3 a version
/// conflict (`compact`, `delete`: another writer committed first; nothing
/// was written for it).
#[derive(Debug, Parser)]
#[command(name = "spool", version, about, long_about)]
pub struct Cli {
    /// The store directory (created by commands that write, like `demo` and
    /// `stress`), or a `postgres://` / `postgresql://` URL.
    #[arg(long, global = true, value_name = "DIR", env = "SPOOL_STORE")]
    pub store: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DurabilityArg {
    /// fdatasync before every acknowledgement (group commit shares it).
    Immediate,
    /// Acknowledge from the page cache; flush on a timer and on close.
    Buffered,
}

/// Formats `import` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ImportFormat {
    /// A `spool export` file (JSONL, `spool-export` version 1).
    Spool,
    /// A pi-style coding-agent session file (JSONL, versions 1, 2 and 3).
    Pi,
}

/// Shapes `context` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ContextFormat {
    /// spool's context messages (with entry ids, model and thinking level).
    Spool,
    /// OpenAI Chat Completions: `{"model", "messages"}`, the system prompt first.
    Openai,
    /// Anthropic Messages: `{"model", "system", "messages"}`.
    Anthropic,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Build a sample store with branching sessions and show it (the main job).
    Demo {
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
    },

    /// List sessions (from the header index; no session is loaded).
    Sessions {
        /// Only sessions with this status (active, suspended, completed, failed, deleted).
        #[arg(long)]
        status: Option<String>,
        /// Only sessions of this agent.
        #[arg(long)]
        agent: Option<String>,
        /// Only children of this session (id or unique prefix).
        #[arg(long)]
        parent: Option<String>,
        /// At most this many sessions.
        #[arg(long)]
        limit: Option<u32>,
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
    },

    /// Show one session: header, definition and a summary of its state.
    Show {
        /// Session id, or a unique prefix of one (at least 4 characters).
        id: String,
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
    },

    /// Print the transcript tree of a session.
    Tree {
        /// Session id, or a unique prefix of one (at least 4 characters).
        id: String,
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
    },

    /// Print the model context of a session as it is built from its leaf.
    Context {
        /// Session id, or a unique prefix of one (at least 4 characters).
        id: String,
        /// Resident byte budget for the working set the context is built from.
        #[arg(long, value_name = "N")]
        budget_bytes: Option<u64>,
        /// The shape to print: spool's own messages, OpenAI Chat Completions
        /// messages, or an Anthropic Messages request body.
        #[arg(long, value_enum, default_value = "spool")]
        format: ContextFormat,
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
    },

    /// List the log's streams and their head versions.
    Streams {
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
    },

    /// Print the commits of the log in log order.
    Log {
        /// Only commits of this stream (a session id, or a unique prefix of one, is a stream).
        #[arg(long, value_name = "ID")]
        stream: Option<String>,
        /// At most this many commits.
        #[arg(long)]
        limit: Option<u64>,
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
    },

    /// Read every segment, check every record and the index against the log.
    ///
    /// Works without a writer holding the store (e.g. after the writer was
    /// killed). Exits 0 when the store is sound, 1 when corruption is found.
    Verify {
        /// Copy every readable commit into a new store in OUT_DIR (which must
        /// be empty or absent) and report what was lost, by segment and offset.
        /// The damaged store is never written.
        #[arg(long, value_name = "OUT_DIR")]
        salvage: Option<PathBuf>,
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
    },

    /// Rewrite sessions' transcripts to slim them down (prepare, show the plan, commit).
    ///
    /// For each session (one ID, or every non-deleted session with --all)
    /// the transforms are combined into ONE prepared rewrite through the
    /// session runtime's live handle: the plan (entries touched, their
    /// bytes before -> after, entries removed and re-parented) is shown,
    /// then committed as one `transcript_rewritten` event unless --dry-run.
    /// Order within a session: --drop-aborted picks the entries to remove,
    /// then on every other entry (all branches) --redact runs (each REGEX
    /// in turn) and then --truncate-tool-results (so a secret is redacted
    /// before a cut could leave part of it).
    ///
    /// Byte counts are the transcript's entry sizes (what is loaded and
    /// sent), not log bytes: a rewrite appends to the log and the old text
    /// stays in it; `compact --gc` erases it and reclaims log space.
    ///
    /// Exit codes: 0 success (also for a dry run and for "nothing to
    /// change"), 2 the command failed, 3 another writer committed to a
    /// session between prepare and commit (version conflict: nothing was
    /// written for that session; run the command again).
    Compact {
        /// Session id (or a unique prefix) to compact.
        #[arg(required_unless_present_any = ["all", "gc"], conflicts_with = "all")]
        id: Option<String>,
        /// Compact every non-deleted session.
        #[arg(long)]
        all: bool,
        /// Cut tool results whose text is longer than this many bytes (at
        /// least 64), ending them with a `[truncated N bytes]` marker.
        #[arg(long, value_name = "BYTES")]
        truncate_tool_results: Option<u64>,
        /// Replace matches of REGEX in message texts (user, assistant, tool
        /// results, custom messages, summaries) with `[redacted]`. Repeatable.
        #[arg(long = "redact", value_name = "REGEX")]
        redact: Vec<String>,
        /// Remove trailing aborted or errored assistant entries (walking back
        /// from the leaf; custom entries among them are kept).
        #[arg(long)]
        drop_aborted: bool,
        /// Print the prepared plan and commit nothing (the store is opened
        /// read-only).
        #[arg(long)]
        dry_run: bool,
        /// Log garbage collection that erases: remove the records of deleted
        /// and purged sessions and the transcript content a rewrite
        /// superseded (--redact, --truncate-tool-results, --drop-aborted:
        /// the commits stay, that content becomes `spool.erased`
        /// placeholders), from every segment including the active one; then
        /// delete and rebuild the index and remove index checkpoints, so no
        /// file of the store directory holds that content (crash-safe).
        /// With --dry-run, only show the plan (commits in the active
        /// segment are counted, not planned).
        #[arg(long, conflicts_with_all = ["id", "all", "truncate_tool_results", "redact", "drop_aborted"])]
        gc: bool,
        /// Test hook: between prepare and commit, commit a custom entry to
        /// the session through the runtime's session pipeline (a concurrent
        /// writer), so the commit meets a version conflict.
        #[arg(long, hide = true, conflicts_with = "dry_run")]
        test_concurrent_write: bool,
        /// Print one JSON array of per-session plan/result objects.
        #[arg(long)]
        json: bool,
    },

    /// Run a write load, durable by default (for crash testing and throughput).
    ///
    /// Each writer appends one-event commits to its own stream `stress-<i>`
    /// with exact version fences, continuing from the stream's head.
    Stress {
        /// Concurrent writer threads.
        #[arg(long, default_value_t = 1)]
        writers: u32,
        /// How long to run (0 to a year); the run ends early when every
        /// writer has failed.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// Bytes of payload per commit (at most the 16 MiB record size
        /// limit, less the commit's framing).
        #[arg(long, default_value_t = 1024)]
        payload_bytes: u32,
        /// Segment size in bytes.
        #[arg(long)]
        segment_bytes: Option<u64>,
        #[arg(long, value_enum, default_value_t = DurabilityArg::Immediate)]
        durability: DurabilityArg,
        /// After each acknowledged commit append `<stream> <version>` to this file.
        #[arg(long, value_name = "FILE")]
        ack_file: Option<PathBuf>,
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
    },

    /// Summarize the store: segments, bytes, live vs dead bytes, sessions by
    /// status, the largest sessions and the largest entries.
    ///
    /// Dead bytes are commit records a log compaction (`compact --gc`)
    /// would not copy: every record of a tombstoned (`delete`d) session and
    /// every record of a purged session incarnation (including the purge
    /// marker). Everything else is live, including streams that are not
    /// sessions. Reads the log only (works while a writer owns the store).
    /// On a PostgreSQL store: sessions by status and the sessions with the
    /// most versions (there is no log to measure).
    Stats {
        /// How many of the largest sessions and entries to list.
        #[arg(long, default_value_t = 5, value_name = "N")]
        top: u32,
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
    },

    /// Rebuild every derived index and snapshot from the log alone, or show
    /// a session as it was at an earlier version (time travel).
    ///
    /// Without ID: opens the store as its owner with a fresh index built
    /// from the log, loads every session (which writes snapshots for long
    /// histories), compares the answers with the old index, and replaces
    /// the old index with the rebuilt one. Needs exclusive ownership.
    ///
    /// With ID and --at-version N: folds the session's events up to version
    /// N and prints it like `show` (with --json also its transcript and
    /// model context). Read-only.
    Replay {
        /// Session (id or unique prefix) to show as of an earlier version (needs --at-version).
        id: Option<String>,
        /// The session version to show (1 = as created).
        #[arg(long, value_name = "N", requires = "id")]
        at_version: Option<u64>,
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
    },

    /// Export sessions as JSONL (one event per line; see the `spool-export`
    /// format in docs/format.md). `import` reads it back.
    Export {
        /// Session id or unique prefix to export (or use --all).
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        id: Option<String>,
        /// Export every session (tombstoned ones only with --include-deleted).
        #[arg(long)]
        all: bool,
        /// With --all, also export tombstoned (deleted) sessions.
        #[arg(long, requires = "all")]
        include_deleted: bool,
        /// Write to FILE (atomically: complete or not at all) instead of stdout.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },

    /// Import sessions from a file written by `export`, or from a pi-style
    /// coding-agent session file (`--format pi`, versions 1 to 3).
    ///
    /// The whole file is parsed and every session folded before anything
    /// is written; a malformed or truncated file is refused with the line
    /// number and leaves the store unchanged. A session id that already
    /// exists is refused, unless `--resume` finishes an import of the same
    /// file that was cut short.
    Import {
        /// The file to read.
        file: PathBuf,
        /// The file's format.
        #[arg(long, value_enum, default_value_t = ImportFormat::Spool)]
        format: ImportFormat,
        /// Give every commit a fresh commit id (needed to re-import a purged
        /// session into the store it was exported from).
        #[arg(long)]
        fresh_commit_ids: bool,
        /// Finish an import of this file that was cut short (a crash, a kill,
        /// Ctrl-C): sessions it already wrote, commit for commit, are continued
        /// instead of refused. For `spool-export` files on a store directory (a
        /// PostgreSQL import is one transaction and leaves nothing to finish).
        #[arg(long, conflicts_with = "fresh_commit_ids")]
        resume: bool,
        /// Test hook: abort the process (as a kill would: no cleanup, no
        /// rollback) once this many commits are written.
        #[arg(long, hide = true)]
        test_abort_after_commits: Option<u64>,
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
    },

    /// Delete (tombstone) a session. It stays readable with status
    /// `deleted` and accepts no changes; `compact --gc` reclaims its bytes.
    Delete {
        /// Session id, or a unique prefix of one (at least 4 characters).
        id: String,
        /// Test hook: delete the session through a second writer between
        /// this delete's load and its save, as a concurrent `delete` would.
        #[arg(long, hide = true)]
        test_concurrent_delete: bool,
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
    },

    /// Purge a deleted session: remove it from the store so its id can be
    /// created or imported again. Cannot be undone. On a store directory
    /// its records stay in the log until `compact --gc`.
    Purge {
        /// Session id, or a unique prefix of one (at least 4 characters).
        id: String,
        /// Purge the session even if it is not deleted.
        #[arg(long)]
        force: bool,
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
    },
}
