//! `tollgate pump enqueue` and `tollgate pump run`: the durable work pump from the command line.

use std::io::{BufRead, IsTerminal};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use tollgate::parse_duration;
use tollgate_pace::http::{HttpWorker, parse_line};
use tollgate_pace::{Budget, Pacer, Partitions, Progress, PumpOptions, Queue, RedisStreams, pump};

/// Arguments of `tollgate pump`.
#[derive(Debug, Args)]
pub(crate) struct PumpArgs {
    #[command(subcommand)]
    command: PumpCommand,
}

#[derive(Debug, Subcommand)]
enum PumpCommand {
    /// Add work items, one JSON object per line, from a file or stdin (`-`).
    Enqueue(EnqueueArgs),
    /// Drain the queue: send each item as an HTTP request to a throttled API, paced.
    Run(RunArgs),
}

#[derive(Debug, Args)]
struct QueueArgs {
    /// Redis holding the queue (and the partitions).
    #[arg(long, default_value = "redis://127.0.0.1:6379", value_name = "URL")]
    redis_url: String,
    /// The queue's name (the Redis stream {NAME}; dead letters go to {NAME}:dead).
    #[arg(long, default_value = "tollgate:pump", value_name = "NAME")]
    queue: String,
    /// An item not acknowledged this long after delivery is delivered again (its worker died);
    /// must exceed an item's wait for budget plus its request time.
    #[arg(long, default_value = "30s", value_name = "DURATION", value_parser = parse_duration)]
    idle: Duration,
    /// Failed attempts before an item goes to the dead-letter stream.
    #[arg(long, default_value_t = 5)]
    max_attempts: u64,
}

#[derive(Debug, Args)]
struct EnqueueArgs {
    #[command(flatten)]
    queue: QueueArgs,
    /// JSON Lines: {"key", "cost", "method", "path", "headers", "body"}, all optional.
    #[arg(default_value = "-", value_name = "FILE")]
    input: PathBuf,
}

#[derive(Debug, Args)]
struct RunArgs {
    #[command(flatten)]
    queue: QueueArgs,
    /// Base URL of the throttled API; an item's `path` is appended.
    #[arg(long, value_name = "URL")]
    url: String,
    /// The global budget: UNITS/PERIOD, e.g. 200/s, 12000/m (items cost 1 unit unless they say).
    #[arg(long, value_name = "UNITS/PERIOD", value_parser = Budget::parse)]
    rate: Budget,
    /// Split the budget into this many partitions leased through Redis, shared by every worker
    /// on the same queue [default: no partitions, this worker spends the whole budget].
    #[arg(long, value_name = "P")]
    partitions: Option<u64>,
    /// Most partitions this worker holds [default: all].
    #[arg(long, value_name = "K")]
    want: Option<u64>,
    /// How long a dead worker's partitions stay leased.
    #[arg(long, default_value = "5s", value_name = "DURATION", value_parser = parse_duration)]
    lease_ttl: Duration,
    /// The budget is released in slices this long.
    #[arg(long, default_value = "200ms", value_name = "DURATION", value_parser = parse_duration)]
    granularity: Duration,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Timeout of one request.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = parse_duration)]
    timeout: Duration,
    /// This worker's name in the consumer group [default: host-pid].
    #[arg(long)]
    consumer: Option<String>,
    /// Keep waiting for work when the queue is empty.
    #[arg(long)]
    follow: bool,
    /// How long Redis may stay unreachable (restarting, failing over) before the pump gives up;
    /// until then it tries again, pausing up to 5 s between tries.
    #[arg(long, default_value = "1m", value_name = "DURATION", value_parser = parse_duration)]
    outage: Duration,
}

pub(crate) fn main(args: PumpArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match args.command {
            PumpCommand::Enqueue(args) => enqueue(args).await,
            PumpCommand::Run(args) => run(args).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(Failure::Usage(message)) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
        Err(Failure::Run(message)) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

enum Failure {
    Usage(String),
    Run(String),
}

async fn connect(args: &QueueArgs) -> Result<tollgate_redis::Redis, Failure> {
    tollgate_redis::Redis::connect(&args.redis_url).await.map_err(|e| Failure::Run(e.to_string()))
}

async fn open(args: &QueueArgs, redis: &tollgate_redis::Redis) -> Result<RedisStreams, Failure> {
    RedisStreams::open(redis, &args.queue, args.idle, args.max_attempts).await.map_err(|e| Failure::Run(e.to_string()))
}

async fn enqueue(args: EnqueueArgs) -> Result<ExitCode, Failure> {
    let queue = open(&args.queue, &connect(&args.queue).await?).await?;
    let reader: Box<dyn BufRead> = if args.input.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        let file = std::fs::File::open(&args.input)
            .map_err(|e| Failure::Usage(format!("cannot read {}: {e}", args.input.display())))?;
        Box::new(std::io::BufReader::new(file))
    };
    let (mut added, mut bad) = (0u64, 0u64);
    for (i, line) in reader.lines().enumerate() {
        let line = line.map_err(|e| Failure::Run(format!("reading line {}: {e}", i + 1)))?;
        if line.trim().is_empty() {
            continue;
        }
        match parse_line(&line, i + 1) {
            Ok(item) => {
                queue.enqueue(&item.key, &item.payload, item.cost).await.map_err(|e| Failure::Run(e.to_string()))?;
                added += 1;
            }
            Err(error) => {
                eprintln!("skipped {error}");
                bad += 1;
            }
        }
    }
    println!(
        "enqueued {added} items to {}{}",
        args.queue.queue,
        if bad > 0 { format!(", skipped {bad} bad lines") } else { String::new() }
    );
    Ok(if bad > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

async fn run(args: RunArgs) -> Result<ExitCode, Failure> {
    let usage = |e: String| Failure::Usage(e);
    let (budget, granularity, timeout, lease_ttl) = (args.rate, args.granularity, args.timeout, args.lease_ttl);
    let worker = HttpWorker::new(&args.url, timeout).map_err(|e| usage(format!("--url: {e}")))?;
    let pacer = Arc::new(Pacer::builder(budget).granularity(granularity).build().map_err(|e| usage(e.to_string()))?);
    // One connection for the queue and the partitions: neither blocks in Redis (see `Queue::take`).
    let redis = connect(&args.queue).await?;
    let queue = Arc::new(open(&args.queue, &redis).await?);
    let partitions = match args.partitions {
        None => None,
        Some(p) => {
            let name = format!("{}:partitions", args.queue.queue);
            let builder =
                Partitions::builder(&redis, &name, p, budget).want(args.want.unwrap_or(p)).lease_ttl(lease_ttl);
            Some(builder.join(pacer.clone()).await.map_err(|e| Failure::Run(e.to_string()))?)
        }
    };
    let consumer = args.consumer.unwrap_or_else(|| format!("worker-{}", std::process::id()));
    let mut options = PumpOptions::new(&consumer);
    options.concurrency = args.concurrency.max(1);
    options.stop_when_empty = !args.follow;
    options.outage = args.outage;
    let progress = Arc::new(Progress::default());
    let started = Instant::now();
    let total_at_start = queue.outstanding().await.map_err(|e| Failure::Run(e.to_string()))?;
    let bar = progress_bar(total_at_start);
    let ticker = bar.clone().map(|bar| {
        let (progress, pacer, queue) = (progress.clone(), pacer.clone(), queue.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let left = queue.outstanding().await.unwrap_or(0);
                bar.set_length(progress.done.load(Ordering::Relaxed) + left);
                bar.set_position(progress.done.load(Ordering::Relaxed));
                bar.set_message(format!(
                    "failed {} throttled {} rate {:.0}/s",
                    progress.failed.load(Ordering::Relaxed),
                    progress.throttled.load(Ordering::Relaxed),
                    pacer.rate()
                ));
            }
        })
    });
    let result = pump(queue.clone(), pacer.clone(), options, progress.clone(), move |item| {
        let worker = worker.clone();
        async move { worker.send(&item).await }
    })
    .await;
    if let Some(ticker) = ticker {
        ticker.abort();
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    if let Some(partitions) = partitions {
        let _ = partitions.leave().await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let done = progress.done.load(Ordering::Relaxed);
    println!(
        "{consumer}: done {done}, failed attempts {}, dead-lettered {}, throttled {}, {:.1} s, {:.1} items/s (rate now {:.0}/s)",
        progress.failed.load(Ordering::Relaxed),
        progress.dead.load(Ordering::Relaxed),
        progress.throttled.load(Ordering::Relaxed),
        seconds,
        done as f64 / seconds.max(1e-9),
        pacer.rate()
    );
    result.map_err(|e| Failure::Run(e.to_string()))?;
    Ok(ExitCode::SUCCESS)
}

/// A progress bar on stderr when it is a terminal; nothing otherwise (logs, CI).
fn progress_bar(total: u64) -> Option<indicatif::ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(total);
    let style = indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} done, {msg}, ETA {eta}")
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    bar.set_style(style);
    Some(bar)
}
