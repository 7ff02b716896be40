//! The batch phase (OpenAI's Files + Batch API): per repetition, on a fresh service, the
//! interactive client alone, then the upload of a `batch_lines`-line file, the batch's
//! validation and creation, and its run to `completed` with the interactive client beside it;
//! then, on another fresh service with the same flags, the same lines as background submits.

use super::{Outcome, Phases};
use crate::batch::{self, SERVE_FLAGS};
use crate::client;
use crate::results::{BatchFigures, Results};
use crate::server::CpuMeter;
use crate::stats::Spread;

/// 1 MiB.
const MIB: f64 = 1024.0 * 1024.0;

impl Phases<'_> {
    /// Upload, validate + create, run of a batch beside the same lines posted one by one, and an
    /// interactive client's latency idle and while the batch runs.
    pub(crate) async fn batch_phase(&self) -> anyhow::Result<Outcome> {
        let plan = self.plan;
        let lines = plan.batch_lines;
        eprintln!("== batch");
        let file_mib = batch::file_bytes(lines) as f64 / MIB;
        println!(
            "\n[batch] lmsp serve {} on a fresh data directory per run; a {lines}-line file ({file_mib:.1} MiB) of /v1/responses lines (max_output_tokens {}) uploaded as multipart POST /v1/files, streamed as generated; RSS (VmRSS) read every 5 ms; batch polled every 10 ms until in_progress, then every 25 ms; an interactive client posts a synchronous /v1/responses (max_output_tokens {}) every {} ms, {:.1} s alone first, then while the batch runs; comparison: the same {lines} bodies with background: true, {} at a time, on another fresh service, from the first POST until GET /v1/tasks lists none unfinished",
            SERVE_FLAGS.join(" "),
            batch::LINE_TOKENS,
            batch::INTERACTIVE_TOKENS,
            plan.batch_interactive_every.as_millis(),
            plan.batch_idle.as_secs_f64(),
            plan.batch_submit_clients,
        );
        let mut figures = BatchFigures::default();
        for rep in 0..plan.reps {
            let server = self.server("batch", SERVE_FLAGS)?;
            let http = client::http_client()?;
            let mut idle =
                batch::interactive_idle(&server, plan.batch_interactive_every, plan.batch_idle)
                    .await?;
            println!("  rep {rep}: idle service: {}", idle.describe());

            let cpu = CpuMeter::start(&server);
            let upload = batch::upload(&http, &server, lines).await?;
            let rss = upload.rss.map_or(String::new(), |(before, peak)| {
                format!(
                    "; RSS {before:.1} MiB before, peak {peak:.1} MiB ({:+.1} MiB)",
                    peak - before
                )
            });
            println!(
                "  rep {rep}: upload {} ({:.1} MiB) in {:.3} s = {:.1} MiB/s{rss}; {}",
                upload.file_id,
                upload.bytes as f64 / MIB,
                upload.seconds,
                upload.bytes as f64 / MIB / upload.seconds.max(1e-9),
                cpu.report(&server)
            );

            let cpu = CpuMeter::start(&server);
            let mut run = batch::run_batch(
                &http,
                &server,
                &upload.file_id,
                lines,
                plan.batch_interactive_every,
            )
            .await?;
            let rss = run.create_rss.map_or(String::new(), |(before, peak)| {
                format!(
                    "; RSS {before:.1} MiB before, peak {peak:.1} MiB ({:+.1} MiB)",
                    peak - before
                )
            });
            println!(
                "  rep {rep}: POST /v1/batches → in_progress {:.3} s{rss}; in_progress → completed {:.3} s = {:.0} lines/s (every line counted after {:.3} s, then {:.3} s to completed); POST → completed {:.3} s = {:.0} lines/s; {} lines completed; {}; during the batch: {}",
                run.to_in_progress_s,
                run.run_s,
                lines as f64 / run.run_s.max(1e-9),
                run.counted_s,
                run.finalize_s,
                run.total_s,
                lines as f64 / run.total_s.max(1e-9),
                run.completed,
                cpu.report(&server),
                run.interactive.describe()
            );
            let ((running, n_running), (finalizing, n_finalizing)) =
                run.interactive.p99_split(run.counted_at);
            println!(
                "  rep {rep}: interactive p99 while lines run {running:.2} ms ({n_running} requests), after every line was counted (upkeep noticing, then output file) {finalizing:.2} ms ({n_finalizing} requests)"
            );
            drop(server);

            let server = self.server("batch-background", SERVE_FLAGS)?;
            let cpu = CpuMeter::start(&server);
            let (per_s, submitted) =
                batch::background(&http, &server, lines, plan.batch_submit_clients).await?;
            println!(
                "  rep {rep}: {lines} background submits ({} clients) posted in {submitted:.3} s, all finished after {:.3} s = {per_s:.0} lines/s; {}",
                plan.batch_submit_clients,
                lines as f64 / per_s,
                cpu.report(&server)
            );
            drop(server);

            figures.upload_s.push(upload.seconds);
            if let Some((before, peak)) = upload.rss {
                figures.upload_rss_before.push(before);
                figures.upload_rss_peak.push(peak);
                figures.upload_rss_growth.push(peak - before);
            }
            figures.create_s.push(run.to_in_progress_s);
            if let Some((before, peak)) = run.create_rss {
                figures.create_rss_before.push(before);
                figures.create_rss_peak.push(peak);
                figures.create_rss_growth.push(peak - before);
            }
            figures.lines_per_s.push(lines as f64 / run.run_s.max(1e-9));
            figures
                .end_to_end_per_s
                .push(lines as f64 / run.total_s.max(1e-9));
            figures.finalize_s.push(run.finalize_s);
            figures.background_per_s.push(per_s);
            figures.idle_p99.push(idle.latencies.quantile_ms(0.99));
            figures.idle_p50.push(idle.latencies.quantile_ms(0.5));
            figures
                .busy_p99
                .push(run.interactive.latencies.quantile_ms(0.99));
            figures
                .busy_p50
                .push(run.interactive.latencies.quantile_ms(0.5));
            figures.interactive_errors += idle.errors + run.interactive.errors;
            if run.interactive.latencies.is_empty() || idle.latencies.is_empty() {
                anyhow::bail!("the interactive client got no answer (idle or during the batch)");
            }
        }
        Ok(Outcome::Done(Box::new(move |r: &mut Results| {
            r.batch = figures;
        })))
    }
}

/// The files of the batch memory figure: lines, and the characters each line's input is padded
/// by (the last: the same lines in a file about seven times larger).
const MEMORY_FILES: &[(usize, usize)] = &[(5_000, 0), (25_000, 0), (50_000, 0), (50_000, 1_000)];

impl Phases<'_> {
    /// Peak RSS of a batch's upload and of its validation and creation, for files of several
    /// sizes (each on a fresh service; the batch cancelled once `in_progress`, its lines not
    /// run): whether the memory they take grows with the file.
    pub(crate) async fn batch_memory_phase(&self) -> anyhow::Result<Outcome> {
        eprintln!("== batch memory");
        println!(
            "\n[batch-memory] lmsp serve {} on a fresh data directory per file; each file uploaded (multipart POST /v1/files, streamed as generated), then POST /v1/batches polled every 10 ms until in_progress, then cancelled; VmRSS read every 5 ms; min / median / max of the repetitions",
            SERVE_FLAGS.join(" ")
        );
        println!();
        println!("| lines | file | upload: RSS before → peak (Δ) | validate + create: RSS before → peak (Δ) | validate + create time |");
        println!("| --- | --- | --- | --- | --- |");
        for &(lines, pad) in MEMORY_FILES {
            let mut upload_delta = Spread::default();
            let mut create_delta = Spread::default();
            let mut create_s = Spread::default();
            let mut before = (Spread::default(), Spread::default());
            let mut peak = (Spread::default(), Spread::default());
            for _ in 0..self.plan.reps {
                let server = self.server("batch-memory", SERVE_FLAGS)?;
                let http = client::http_client()?;
                let upload = batch::upload_padded(&http, &server, lines, pad).await?;
                let created = batch::create_batch(&http, &server, &upload.file_id).await?;
                let cancel = http
                    .post(server.url(&format!("/v1/batches/{}/cancel", created.id)))
                    .bearer_auth(&server.token)
                    .send()
                    .await?;
                if !cancel.status().is_success() {
                    anyhow::bail!("cancelling batch {}: {}", created.id, cancel.status());
                }
                let (Some(up), Some(made)) = (upload.rss, created.rss) else {
                    return Ok(Outcome::Skipped(String::from(
                        "no process to read the RSS of (--url)",
                    )));
                };
                upload_delta.push(up.1 - up.0);
                create_delta.push(made.1 - made.0);
                before.0.push(up.0);
                peak.0.push(up.1);
                before.1.push(made.0);
                peak.1.push(made.1);
                create_s.push(created.started.duration_since(created.sent).as_secs_f64());
            }
            println!(
                "| {lines} | {:.1} MiB | {} → {} MiB ({} MiB) | {} → {} MiB ({} MiB) | {} s |",
                batch::padded_file_bytes(lines, pad) as f64 / MIB,
                before.0.format(1),
                peak.0.format(1),
                upload_delta.format(1),
                before.1.format(1),
                peak.1.format(1),
                create_delta.format(1),
                create_s.format(2),
            );
        }
        Ok(Outcome::Done(Box::new(|_| {})))
    }
}
