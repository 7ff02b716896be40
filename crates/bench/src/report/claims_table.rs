//! The table of the claims and webhooks figures: SQLite claims per second with a long queue
//! across the three tiers and many clients against the same queue of one client in one tier,
//! and completions per second with a webhook receiver that hangs against none.

use crate::plan::Plan;
use crate::results::Results;
use crate::webhooks;

use super::rows::*;

/// Claims across tiers must reach this share of the single queue's, percent.
const CLAIMS_AT_LEAST: f64 = 90.0;
/// Completions with a hanging receiver must reach this share of those without, percent.
const COMPLETIONS_AT_LEAST: f64 = 90.0;

/// Prints the claims and webhooks table.
pub(super) fn claims_table(plan: &Plan, r: &Results) {
    let c = &r.claims;
    let w = &r.webhooks;
    let claims = r.problems.get("claims");
    let hooks = r.problems.get("webhooks");
    let queued = n(plan.claim_queue as f64);
    let loops = plan.claim_loops;
    let clients = n(plan.claim_clients as f64);
    let single = c.single_per_s.median();
    let without = w.without_per_s.median();
    let mut rows = vec![
        percent_row(
            format!(
                "claims: claims per second, {queued} tasks queued across 3 tiers and {clients} clients, {loops} claim loops"
            ),
            &c.tiers_per_s,
            "/s",
            single,
            format!("the same {queued} tasks of one client in one tier: {}/s", n(single)),
            Some(CLAIMS_AT_LEAST),
            claims,
        ),
        percent_row(
            format!(
                "webhooks: completions per second with a receiver that hangs (a hanging receiver does not slow completions), {} tasks",
                n(plan.webhook_tasks as f64)
            ),
            &w.hanging_per_s,
            "/s",
            without,
            format!("no webhook endpoint: {}/s", n(without)),
            Some(COMPLETIONS_AT_LEAST),
            hooks,
        ),
    ];
    rows.push(plain_row_digits(
        format!(
            "claims: claims per second, {queued} tasks of one client in the default tier (single queue), {loops} claim loops"
        ),
        &[&c.single_per_s],
        "/s",
        0,
        claims,
    ));
    rows.push(plain_row_digits(
        String::from("claims: claim_next latency p50 / p99, single queue"),
        &[&c.single_p50, &c.single_p99],
        "ms",
        2,
        claims,
    ));
    rows.push(plain_row_digits(
        format!("claims: claim_next latency p50 / p99, across 3 tiers and {clients} clients"),
        &[&c.tiers_p50, &c.tiers_p99],
        "ms",
        2,
        claims,
    ));
    rows.push(plain_row_digits(
        format!(
            "claims: preparing {queued} queued tasks through the port (once per run), single queue ; across tiers"
        ),
        &[&c.prepare_single_s, &c.prepare_tiers_s],
        "s",
        1,
        claims,
    ));
    rows.push(plain_row_digits(
        format!(
            "webhooks: completions per second, no webhook endpoint, {} tasks",
            n(plan.webhook_tasks as f64)
        ),
        &[&w.without_per_s],
        "/s",
        0,
        hooks,
    ));
    rows.push(plain_row_digits(
        format!(
            "webhooks: deliveries still pending at the end (hanging receiver, --webhook-timeout {})",
            webhooks::WEBHOOK_TIMEOUT
        ),
        &[&w.pending],
        "",
        0,
        hooks,
    ));
    print_table(
        &format!(
            "## Claims across tiers (SQLite, in process) and webhook figures (lmsp serve {})",
            webhooks::SERVE_FLAGS.join(" ")
        ),
        &rows,
    );
}
