//! `spool compact`: slim sessions down through the runtime's prepared
//! rewrites (prepare → show the plan → commit), and log GC (`--gc`).
//!
//! Per session, every requested transform is folded into ONE replacement
//! set and ONE prepared rewrite (so a session is rewritten atomically, by
//! one `transcript_rewritten` event, or not at all):
//!
//! 1. `--drop-aborted`: the trailing aborted/errored assistant entries,
//!    found by [`remove_trailing_entries`] walking back from the leaf
//!    (custom entries among them are kept and re-parented, judged on their
//!    indexed facts so their payload is never loaded);
//! 2. on every other entry of the transcript (all branches, one entry at a
//!    time): `--redact` (each pattern in turn), then
//!    `--truncate-tool-results`. Redaction runs first so a cut can never
//!    leave a partial secret that the pattern no longer matches, and so a
//!    truncated result always fits its limit.
//!
//! The replacements are computed against the transcript version read
//! before the scan; [`SessionHandle::prepare_rewrite`] refuses the plan if
//! the session moved since, and [`SessionHandle::commit_rewrite`] refuses
//! it if another writer committed between prepare and commit. Either is a
//! version conflict: nothing is written for that session, the command
//! goes on with the others and exits with [`EXIT_CONFLICT`].
//!
//! A dry run opens the store read-only (no lock, nothing written) and
//! drops each preparation uncommitted: the store's files are untouched.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::io::IsTerminal as _;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use regex::{NoExpand, Regex};
use serde::Serialize;
use serde_json::json;
use spool_runtime::actions::{ActionError, SessionAction};
use spool_runtime::handle::{HandleError, HandleOptions, PreparedRewrite, SessionHandle};
use spool_runtime::session::{AgentSession, SessionId, SessionStatus};
use spool_runtime::store::{ListOrder, LogStore, SortDirection, TranscriptBackend, TranscriptHead};
use spool_runtime::transcript::{
    redact, remove_trailing_entries, truncate_tool_results, CancelToken, Entry, EntryFacts,
    EntryId, EntryKind, Message, Replacement, StopReason, TranscriptVersion,
};
use spool_runtime::{ListQuery, SessionRuntime, SessionStore as _};

use crate::out::{human_bytes, print_json, Result, Table, ToolError};
use crate::session_open::{parse_id, read_only, runtime_err, writable};

/// Exit code when another writer committed to a session between prepare
/// and commit (a version conflict): nothing was written for it.
pub const EXIT_CONFLICT: u8 = 3;

/// What a redacted match is replaced with.
pub const REDACTED: &str = "[redacted]";

/// The `custom_type` of the entry the hidden concurrency test hook commits.
const TEST_HOOK_CUSTOM_TYPE: &str = "spool.compact.concurrent-write";

/// The parsed command line of `spool compact`.
pub struct Args {
    pub id: Option<String>,
    pub all: bool,
    pub truncate_tool_results: Option<u64>,
    pub redact: Vec<String>,
    pub drop_aborted: bool,
    pub dry_run: bool,
    pub gc: bool,
    pub test_concurrent_write: bool,
    pub json: bool,
}

/// The transforms to apply, validated.
struct Transforms {
    truncate: Option<u64>,
    redact: Vec<Regex>,
    drop_aborted: bool,
}

impl Transforms {
    fn from_args(args: &Args) -> Result<Transforms> {
        let mut redact = Vec::with_capacity(args.redact.len());
        for p in &args.redact {
            let re = Regex::new(p).map_err(|e| {
                ToolError::with_source(
                    format!("--redact {p:?} is not a valid regular expression"),
                    e,
                )
                .hint("the syntax is the `regex` crate's (Rust regular expressions)")
            })?;
            // A pattern matching "" would insert the marker between every
            // character, and again on every later run.
            if re.is_match("") {
                return Err(
                    ToolError::new(format!("--redact {p:?} matches the empty string")).hint(
                        "give a pattern that matches at least one character (e.g. `x+`, not `x*`)",
                    ),
                );
            }
            redact.push(re);
        }
        let t = Transforms {
            truncate: args.truncate_tool_results,
            redact,
            drop_aborted: args.drop_aborted,
        };
        if t.truncate.is_none() && t.redact.is_empty() && !t.drop_aborted {
            return Err(ToolError::new("compact: nothing to do").hint(
                "give at least one of --truncate-tool-results BYTES, --redact REGEX, --drop-aborted (or --gc)",
            ));
        }
        Ok(t)
    }

    /// Every pattern in turn, each match replaced by [`REDACTED`].
    fn redact_text(&self, text: &str) -> String {
        let mut out: Cow<'_, str> = Cow::Borrowed(text);
        for re in &self.redact {
            let next = match re.replace_all(&out, NoExpand(REDACTED)) {
                Cow::Owned(s) => Some(s),
                Cow::Borrowed(_) => None,
            };
            if let Some(s) = next {
                out = Cow::Owned(s);
            }
        }
        out.into_owned()
    }
}

/// A trailing entry `--drop-aborted` removes.
fn is_aborted_assistant(e: &Entry) -> bool {
    matches!(
        &e.kind,
        EntryKind::Message {
            message: Message::Assistant {
                stop_reason: StopReason::Aborted | StopReason::Error,
                ..
            }
        }
    )
}

/// Entries `--drop-aborted` keeps among the trailing ones (plugin state;
/// judged on indexed facts, the payload is never loaded).
fn is_custom(f: &EntryFacts) -> bool {
    f.kind == "custom"
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Outcome {
    /// Dry run: the plan was prepared and dropped.
    Planned,
    /// The rewrite was committed.
    Committed,
    /// The plan was empty: nothing to change.
    Unchanged,
    /// Another writer committed first: nothing was written.
    Conflict,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Planned => "planned",
            Outcome::Committed => "committed",
            Outcome::Unchanged => "unchanged",
            Outcome::Conflict => "conflict",
        }
    }
}

/// How many entries each transform changed.
#[derive(Clone, Copy, Debug, Default, Serialize)]
struct TransformCounts {
    redacted: u64,
    truncated: u64,
    dropped_aborted: u64,
    /// Trailing custom entries kept (re-parented) by `--drop-aborted`.
    preserved_custom: u64,
}

/// One touched entry of a plan.
#[derive(Clone, Debug, Serialize)]
struct EntryRow {
    id: String,
    /// `replaced`, `removed`, `reparented` or `replaced+reparented`.
    change: &'static str,
    /// Why: `redacted`, `truncated`, `redacted+truncated`, `aborted`, or
    /// `parent removed` for a re-parented entry.
    reason: String,
    size_before: u64,
    size_after: u64,
    /// The new parent of a re-parented entry (`null`: it became a root).
    #[serde(skip_serializing_if = "Option::is_none")]
    new_parent: Option<Option<String>>,
}

/// The plan and result of one session.
#[derive(Clone, Debug, Serialize)]
struct Report {
    session: String,
    outcome: Outcome,
    dry_run: bool,
    /// The transcript version the plan was prepared against.
    version_before: TranscriptVersion,
    /// The transcript version after the commit (committed only).
    version_after: Option<TranscriptVersion>,
    /// The session version after the commit (committed only).
    session_version_after: Option<u64>,
    entries_touched: u64,
    entries_replaced: u64,
    entries_removed: u64,
    entries_reparented: u64,
    /// Sum of the touched entries' sizes before and after (entry-size
    /// units: their JSON encoding), and the difference.
    bytes_before: u64,
    bytes_after: u64,
    bytes_delta: i64,
    entries_delta: i64,
    leaf_before: Option<String>,
    leaf_after: Option<String>,
    transforms: TransformCounts,
    entries: Vec<EntryRow>,
    /// Why the session was not rewritten (conflict only).
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

impl Report {
    fn new(id: &SessionId, dry_run: bool, head: &TranscriptHead, t: TransformCounts) -> Report {
        Report {
            session: id.to_string(),
            outcome: Outcome::Unchanged,
            dry_run,
            version_before: head.version,
            version_after: None,
            session_version_after: None,
            entries_touched: 0,
            entries_replaced: 0,
            entries_removed: 0,
            entries_reparented: 0,
            bytes_before: 0,
            bytes_after: 0,
            bytes_delta: 0,
            entries_delta: 0,
            leaf_before: head.leaf.as_ref().map(|l| l.to_string()),
            leaf_after: head.leaf.as_ref().map(|l| l.to_string()),
            transforms: t,
            entries: Vec::new(),
            error: None,
        }
    }

    fn fill_plan(&mut self, prepared: &PreparedRewrite, reasons: &HashMap<EntryId, String>) {
        let plan = prepared.plan();
        self.entries_touched = count(prepared.mapping().len());
        self.entries_replaced = count(plan.written.len());
        self.entries_removed = count(plan.removed.len());
        self.entries_reparented = count(plan.reparented.len());
        self.bytes_delta = prepared.bytes_delta();
        self.entries_delta = prepared.entries_delta();
        self.leaf_before = plan.old_leaf.as_ref().map(|l| l.to_string());
        self.leaf_after = plan.new_leaf.as_ref().map(|l| l.to_string());
        for m in prepared.mapping() {
            self.bytes_before = self.bytes_before.saturating_add(m.size_before);
            self.bytes_after = self.bytes_after.saturating_add(m.size_after);
            let change = match (&m.destination, m.content_replaced, &m.reparented_to) {
                (None, _, _) => "removed",
                (Some(_), true, Some(_)) => "replaced+reparented",
                (Some(_), true, None) => "replaced",
                (Some(_), false, _) => "reparented",
            };
            let reason = reasons
                .get(&m.source)
                .cloned()
                .unwrap_or_else(|| "parent removed".to_string());
            self.entries.push(EntryRow {
                id: m.source.to_string(),
                change,
                reason,
                size_before: m.size_before,
                size_after: m.size_after,
                new_parent: m
                    .reparented_to
                    .as_ref()
                    .map(|p| p.as_ref().map(|p| p.to_string())),
            });
        }
        self.outcome = if plan.is_empty() {
            Outcome::Unchanged
        } else {
            Outcome::Planned
        };
    }
}

/// The combined replacement set of one session (see the module docs),
/// with the reason of each replacement.
struct Planned {
    replacements: Vec<(EntryId, Replacement)>,
    reasons: HashMap<EntryId, String>,
    counts: TransformCounts,
}

fn read_err(id: &SessionId, e: impl std::error::Error + Send + Sync + 'static) -> ToolError {
    ToolError::with_source(format!("session {id}: reading the transcript failed"), e)
        .hint_from_cause(Some("run `spool --store DIR verify` to check the store"))
}

fn replacements_of(
    backend: &dyn TranscriptBackend,
    id: &SessionId,
    head: &TranscriptHead,
    t: &Transforms,
) -> Result<Planned> {
    let source = backend.source(id).map_err(|e| read_err(id, e))?;
    let mut out = Planned {
        replacements: Vec::new(),
        reasons: HashMap::new(),
        counts: TransformCounts::default(),
    };
    let mut removed: HashSet<EntryId> = HashSet::new();
    if t.drop_aborted {
        let scan = remove_trailing_entries(
            &*source,
            head.leaf.as_ref(),
            &is_aborted_assistant,
            &is_custom,
        )
        .map_err(|e| {
            ToolError::with_source(
                format!("session {id}: finding trailing aborted entries failed"),
                e,
            )
        })?;
        out.counts.dropped_aborted = count(scan.replacements.len());
        out.counts.preserved_custom = count(scan.preserved.len());
        for (eid, r) in scan.replacements {
            removed.insert(eid.clone());
            out.reasons.insert(eid.clone(), "aborted".into());
            out.replacements.push((eid, r));
        }
    }
    if t.truncate.is_none() && t.redact.is_empty() {
        return Ok(out);
    }
    let matcher = |s: &str| t.redact_text(s);
    for eid in backend.entry_ids(id).map_err(|e| read_err(id, e))? {
        if removed.contains(&eid) {
            continue;
        }
        // An id listed but absent was removed by a racing writer: the
        // prepare below reports the version conflict.
        let Some(entry) = source.entry(&eid).map_err(|e| read_err(id, e))? else {
            continue;
        };
        let mut cur: Entry = entry.into_owned();
        let mut why: Vec<&str> = Vec::new();
        if !t.redact.is_empty() {
            if let Some((_, Replacement::Replace(k))) =
                redact(std::iter::once(&cur), &matcher).pop()
            {
                cur.kind = k;
                why.push("redacted");
                out.counts.redacted += 1;
            }
        }
        if let Some(max) = t.truncate {
            if let Some((_, Replacement::Replace(k))) =
                truncate_tool_results(std::iter::once(&cur), max).pop()
            {
                cur.kind = k;
                why.push("truncated");
                out.counts.truncated += 1;
            }
        }
        if !why.is_empty() {
            out.reasons.insert(eid.clone(), why.join("+"));
            out.replacements.push((eid, Replacement::Replace(cur.kind)));
        }
    }
    Ok(out)
}

fn is_conflict(e: &HandleError) -> bool {
    matches!(
        e,
        HandleError::VersionConflict { .. } | HandleError::Conflict { .. }
    ) || matches!(e, HandleError::Store(s) if s.is_conflict())
}

fn handle_err(id: &SessionId, what: &str, e: HandleError) -> ToolError {
    let hint = match &e {
        HandleError::WriterBusy { .. } | HandleError::WriterTimeout { .. } => {
            Some("another writer holds the session; stop it and run the command again")
        }
        HandleError::NotFound { .. } => Some("list sessions with `spool --store DIR sessions`"),
        _ => None,
    };
    ToolError::with_source(format!("session {id}: {what} failed"), e).hint_from_cause(hint)
}

/// The hidden test hook: another writer appends a custom entry between
/// prepare and commit, straight through the store as a second process
/// would (the runtime's own pipeline refuses while this command's writer
/// handle is open).
struct ConcurrentWrite;

impl SessionAction for ConcurrentWrite {
    fn name(&self) -> &str {
        "compact_test_concurrent_write"
    }
    fn execute(&self, session: &mut AgentSession) -> std::result::Result<(), ActionError> {
        session.append(EntryKind::Custom {
            custom_type: TEST_HOOK_CUSTOM_TYPE.into(),
            data: json!({ "between": "prepare and commit" }).into(),
        })?;
        Ok(())
    }
}

struct Ctx<'a> {
    rt: &'a SessionRuntime,
    backend: &'a dyn TranscriptBackend,
    transforms: &'a Transforms,
    dry_run: bool,
    test_concurrent_write: bool,
}

fn conflict_report(mut report: Report, e: &HandleError) -> Report {
    report.outcome = Outcome::Conflict;
    report.version_after = None;
    report.session_version_after = None;
    report.error = Some(crate::out::chain_text(e));
    report
}

/// Plans (and unless a dry run, commits) the rewrite of one session.
fn compact_one(ctx: &Ctx<'_>, id: &SessionId) -> Result<Report> {
    let handle: SessionHandle =
        ctx.rt
            .open_handle(id, HandleOptions::writer())
            .map_err(|e| match e {
                HandleError::NotFound { .. } => runtime_err(
                    id,
                    spool_runtime::RuntimeError::Store(spool_runtime::StoreError::NotFound {
                        id: id.clone(),
                    }),
                ),
                e => handle_err(id, "opening a writer handle", e),
            })?;
    let head = ctx
        .backend
        .head(id)
        .map_err(|e| read_err(id, e))?
        .ok_or_else(|| {
            ToolError::new(format!("no session {id} in this store"))
                .hint("list sessions with `spool --store DIR sessions`")
        })?;
    if head.header.status == SessionStatus::Deleted {
        return Err(ToolError::new(format!(
            "session {id} is deleted; deleted sessions are not rewritten"
        ))
        .hint("`compact --gc` reclaims a deleted session's log records"));
    }
    let planned = replacements_of(ctx.backend, id, &head, ctx.transforms)?;
    let mut report = Report::new(id, ctx.dry_run, &head, planned.counts);
    let cancel = CancelToken::new();
    let prepared = match handle.prepare_rewrite(planned.replacements, head.version, &cancel) {
        Ok(p) => p,
        Err(e) if is_conflict(&e) => return Ok(conflict_report(report, &e)),
        Err(e) => return Err(handle_err(id, "preparing the rewrite", e)),
    };
    report.fill_plan(&prepared, &planned.reasons);
    if ctx.dry_run || report.outcome == Outcome::Unchanged {
        // Dropping the preparation releases the handle's rewrite slot;
        // nothing was written.
        return Ok(report);
    }
    if ctx.test_concurrent_write {
        let store = ctx.rt.store();
        let mut session = store
            .load(id)
            .map_err(|e| runtime_err(id, e.into()))?
            .ok_or_else(|| ToolError::new(format!("no session {id} in this store")))?;
        ConcurrentWrite
            .execute(&mut session)
            .map_err(|e| ToolError::new(format!("session {id}: test write failed: {e}")))?;
        store.save(session).map_err(|e| runtime_err(id, e.into()))?;
    }
    match handle.commit_rewrite(prepared, &cancel) {
        Ok(c) => {
            report.outcome = if c.written {
                Outcome::Committed
            } else {
                Outcome::Unchanged
            };
            report.version_after = Some(c.version);
            report.session_version_after = Some(c.session_version);
            Ok(report)
        }
        Err(e) if is_conflict(&e) => Ok(conflict_report(report, &e)),
        Err(e) => Err(handle_err(id, "committing the rewrite", e)),
    }
}

/// The sessions to compact: the one given, or every non-deleted session
/// (oldest first, so the order is stable across runs).
fn targets(rt: &SessionRuntime, args: &Args, one: Option<SessionId>) -> Result<Vec<SessionId>> {
    if let Some(id) = one {
        return Ok(vec![id]);
    }
    if !args.all {
        return Err(ToolError::new("compact: no session given")
            .hint("give a session ID, or --all for every session"));
    }
    let list = rt
        .list_sessions(&ListQuery::all().order_by(ListOrder::CreatedAt, SortDirection::Ascending))
        .map_err(|e| ToolError::with_source("listing sessions failed", e).hint_from_cause(None))?;
    for s in &list.skipped {
        eprintln!("warning: an unreadable session header was skipped: {s:?}");
    }
    Ok(list.headers.into_iter().map(|h| h.id).collect())
}

fn progress(n: usize) -> indicatif::ProgressBar {
    if n <= 1 || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(count(n));
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{spinner} compacting {pos}/{len} sessions [{bar:30}] {elapsed}",
    ) {
        pb.set_style(style);
    }
    pb
}

fn print_human(reports: &[Report], dry_run: bool) -> Result<()> {
    for r in reports {
        if r.entries.is_empty() && r.outcome != Outcome::Conflict {
            continue;
        }
        crate::outln!(
            "session {}: {}{}",
            r.session,
            r.outcome.as_str(),
            r.error
                .as_ref()
                .map(|e| format!(" ({e}); nothing was written"))
                .unwrap_or_default()
        );
        let mut t = Table::new(&["ENTRY", "CHANGE", "REASON", "BEFORE", "AFTER"])
            .right(3)
            .right(4);
        for e in &r.entries {
            t.row(vec![
                e.id.clone(),
                e.change.to_string(),
                e.reason.clone(),
                human_bytes(e.size_before),
                human_bytes(e.size_after),
            ]);
        }
        t.print()?;
        if r.leaf_before != r.leaf_after {
            crate::outln!(
                "leaf: {} -> {}",
                r.leaf_before.as_deref().unwrap_or("(none)"),
                r.leaf_after.as_deref().unwrap_or("(none)")
            );
        }
        crate::outln!();
    }
    let mut t = Table::new(&[
        "SESSION",
        "OUTCOME",
        "TOUCHED",
        "REPLACED",
        "REMOVED",
        "REPARENTED",
        "BYTES BEFORE -> AFTER",
    ])
    .right(2)
    .right(3)
    .right(4)
    .right(5)
    .right(6);
    for r in reports {
        t.row(vec![
            r.session.clone(),
            r.outcome.as_str().to_string(),
            r.entries_touched.to_string(),
            r.entries_replaced.to_string(),
            r.entries_removed.to_string(),
            r.entries_reparented.to_string(),
            format!(
                "{} -> {}",
                human_bytes(r.bytes_before),
                human_bytes(r.bytes_after)
            ),
        ]);
    }
    t.print()?;
    let n = |o: Outcome| reports.iter().filter(|r| r.outcome == o).count();
    if dry_run {
        crate::outln!(
            "dry run: {} of {} sessions would be rewritten; nothing was written",
            n(Outcome::Planned),
            reports.len()
        );
    } else {
        crate::outln!(
            "{} sessions rewritten, {} unchanged, {} version conflicts",
            n(Outcome::Committed),
            n(Outcome::Unchanged),
            n(Outcome::Conflict)
        );
    }
    Ok(())
}

pub fn run(dir: &Path, args: Args) -> Result<ExitCode> {
    if args.gc {
        return super::gc::run(dir, args.dry_run, args.json);
    }
    // Everything that can be refused without the store is checked before
    // it is opened.
    let transforms = Transforms::from_args(&args)?;
    let one = args.id.as_deref().map(parse_id).transpose()?;
    crate::cmd::require_existing_store(dir)?;
    let (store, rt): (Arc<LogStore>, SessionRuntime) = if args.dry_run {
        read_only(dir)?
    } else {
        writable(dir)?
    };
    let backend = store
        .transcript_backend()
        .ok_or_else(|| ToolError::new("this store keeps no transcript index; compact needs one"))?;
    let ids = targets(&rt, &args, one)?;
    let ctx = Ctx {
        rt: &rt,
        backend,
        transforms: &transforms,
        dry_run: args.dry_run,
        test_concurrent_write: args.test_concurrent_write,
    };
    let pb = progress(ids.len());
    let mut reports = Vec::with_capacity(ids.len());
    let mut failure = None;
    for id in &ids {
        let r = compact_one(&ctx, id);
        pb.inc(1);
        match r {
            Ok(r) => reports.push(r),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    pb.finish_and_clear();
    // On a failure the sessions done before it are still shown: their
    // rewrites are committed.
    if failure.is_none() || !reports.is_empty() {
        if args.json {
            print_json(&reports)?;
        } else {
            print_human(&reports, args.dry_run)?;
        }
    }
    if let Some(e) = failure {
        return Err(e);
    }
    let conflicts: Vec<&Report> = reports
        .iter()
        .filter(|r| r.outcome == Outcome::Conflict)
        .collect();
    if conflicts.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    for r in &conflicts {
        eprintln!(
            "error: session {}: version conflict: another writer committed between prepare and commit; nothing was written for this session",
            r.session
        );
    }
    eprintln!("hint: run the command again to plan against the new version");
    Ok(ExitCode::from(EXIT_CONFLICT))
}
