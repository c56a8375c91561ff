//! Decisions per second against a local redis-server this bench starts, next to the ceiling of
//! the same machine measured the same way: EVALSHA of a script that only returns 1, from the same
//! number of concurrent tasks over one multiplexed connection.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use tollgate::Quota;
use tollgate_redis::{AlgorithmKind, Redis, RedisLimiter, RedisOptions, RedisSemaphore};

fn bench(c: &mut Criterion) {
    let server = tollgate_testkit::RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let options = RedisOptions { deadline: Duration::from_secs(5), ..Default::default() };
    let redis = rt.block_on(Redis::connect_with(&server.url(), options)).unwrap();
    let limiter = RedisLimiter::builder(&redis, "bench", AlgorithmKind::TokenBucket)
        .limit("l", Quota::per_second(1_000_000).unwrap().with_burst(1_000_000).unwrap())
        .build()
        .unwrap();
    let trivial = Arc::new(redis::Script::new("return 1"));
    let semaphore = RedisSemaphore::new(&redis, "bench-sem", 64).unwrap();

    let mut g = c.benchmark_group("redis_decisions");
    g.warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3)).sample_size(10);
    for tasks in [1usize, 64] {
        // Time per decision = wall time for `iters` decisions spread over `tasks` tasks.
        let run = |work: Arc<dyn Fn(u64, u64) -> futures::future::BoxFuture<'static, ()> + Send + Sync>| {
            let rt = &rt;
            move |iters: u64| {
                rt.block_on(async {
                    let per = iters.div_ceil(tasks as u64);
                    let start = Instant::now();
                    let handles: Vec<_> = (0..tasks).map(|t| tokio::spawn(work(per, t as u64))).collect();
                    for h in handles {
                        h.await.unwrap();
                    }
                    start.elapsed().mul_f64(iters as f64 / (per * tasks as u64) as f64)
                })
            }
        };
        let l = limiter.clone();
        g.bench_function(format!("token_bucket/{tasks}_tasks"), |b| {
            let l = l.clone();
            b.iter_custom(run(Arc::new(move |per, task| {
                let l = l.clone();
                Box::pin(async move {
                    let key = format!("k{task}");
                    for _ in 0..per {
                        let _ = l.try_acquire(&key, 1).await.unwrap();
                    }
                })
            })))
        });
        let (r, s) = (redis.clone(), trivial.clone());
        g.bench_function(format!("ceiling_evalsha_return_1/{tasks}_tasks"), |b| {
            let (r, s) = (r.clone(), s.clone());
            b.iter_custom(run(Arc::new(move |per, _task| {
                let (r, s) = (r.clone(), s.clone());
                Box::pin(async move {
                    for _ in 0..per {
                        let _: i64 = r.invoke(&s, &["k".to_owned()], &[]).await.unwrap();
                    }
                })
            })))
        });
    }
    let sem = semaphore.clone();
    g.bench_function("semaphore_acquire_release/1_task", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    let guard = sem.acquire().await.unwrap();
                    guard.release().await.unwrap();
                }
                start.elapsed()
            })
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
