//! The `latency` (insert → running / finished into an idle DEN) and `depth` (claims from a
//! shallow against a deep queue) scenarios, on MongoDB.

use std::time::{Duration, Instant};

use bson::{doc, Document};

use super::{finish_rate, median, percentile, queued, wait_finished, Bench};

impl Bench {
    pub(super) async fn latency(&self) {
        let db = self.db("latency").await;
        let q = self.queue(&db, self.threads).await;
        let (stop, handle) = self.den(&db, "bench-latency");
        let tasks = db.collection::<Document>("tasks");
        // Let the DEN load the plugin and settle into idle: one task through, then wait.
        let warm = tasks.insert_one(queued(q, &doc! {})).await.unwrap().inserted_id;
        let warm = warm.as_object_id().unwrap();
        assert!(wait_finished(&db, doc! {"_id": warm, "status": 1}, 1, Duration::from_secs(30)).await);
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let samples = if self.quick { 40 } else { 100 };
        let (mut to_running, mut to_finished) = (Vec::new(), Vec::new());
        for i in 0..samples {
            // Even samples are trivial (insert → finished); odd ones sleep 20 ms in the
            // plugin so that the running state is seen by polling (insert → running).
            let slow = i % 2 == 1;
            let params = if slow {
                doc! {"sleep_ms": 20}
            } else {
                doc! {}
            };
            let start = Instant::now();
            let id = tasks.insert_one(queued(q, &params)).await.unwrap().inserted_id;
            loop {
                let d = tasks
                    .find_one(doc! {"_id": &id})
                    .projection(doc! {"status": 1})
                    .await
                    .unwrap()
                    .unwrap();
                let s = d.get_i32("status").unwrap_or(-2);
                if slow && s >= 0 {
                    to_running.push(start.elapsed().as_secs_f64() * 1e3);
                    break;
                }
                if s > 0 {
                    to_finished.push(start.elapsed().as_secs_f64() * 1e3);
                    break;
                }
                tokio::time::sleep(Duration::from_micros(500)).await;
            }
            if slow {
                wait_finished(&db, doc! {"_id": &id, "status": 1}, 1, Duration::from_secs(10)).await;
            }
            tokio::time::sleep(Duration::from_millis(60)).await; // idle again
        }
        stop.cancel();
        handle.await.unwrap();
        db.drop().await.ok();
        let (r50, r99) = (percentile(to_running.clone(), 0.5), percentile(to_running, 0.99));
        let (f50, f99) = (percentile(to_finished.clone(), 0.5), percentile(to_finished, 0.99));
        println!(
            "\n## latency: one task at a time into an idle DEN ({} samples each; polled every 0.5 ms)",
            samples / 2
        );
        println!("| | p50 ms | p99 ms |\n|---|---|---|");
        println!("| insert → running (task sleeping 20 ms) | {r50:.1} | {r99:.1} |");
        println!("| insert → finished (trivial task) | {f50:.1} | {f99:.1} |");
        println!("RESULT latency running_p50_ms={r50:.1} running_p99_ms={r99:.1} finished_p50_ms={f50:.1} finished_p99_ms={f99:.1}");
    }

    /// Driver-only and DEN rates for `n` claims from one queue `depth` deep: the driver
    /// loop takes the first `n`, then one DEN the next `n` (the depth changes by 2n at most).
    pub(super) async fn at_depth(&self, n: usize, depth: usize) -> (f64, f64) {
        let db = self.db("depth").await;
        let q = self.queue(&db, self.threads).await;
        self.tasks(&db, q, depth, doc! {}).await;
        let (driver, _) = self.driver_loop(&db, q, n, false).await;
        let (stop, handle) = self.den(&db, "bench-depth");
        let filter = doc! {"node": "bench-depth", "status": 1};
        assert!(wait_finished(&db, filter.clone(), n as u64, Duration::from_secs(600)).await);
        stop.cancel();
        handle.await.unwrap();
        let (den, _) = finish_rate(&db, filter).await;
        db.drop().await.ok();
        (driver, den)
    }

    pub(super) async fn depth(&self) {
        let (shallow, deep, n, rounds) = (1_000, self.deep, self.claims, self.rounds);
        let (mut d_s, mut d_d, mut c_s, mut c_d) = (vec![], vec![], vec![], vec![]);
        for _ in 0..rounds {
            let (c, d) = self.at_depth(n, shallow).await;
            c_s.push(c);
            d_s.push(d);
            let (c, d) = self.at_depth(n, deep).await;
            c_d.push(c);
            d_d.push(d);
        }
        let (c_s, c_d, d_s, d_d) = (median(c_s), median(c_d), median(d_s), median(d_d));
        println!(
            "\n## depth: {n} claims from a queue {shallow} vs {deep} deep, {} at a time (median of {rounds} rounds)",
            self.threads
        );
        println!("| | {shallow} deep /s | {deep} deep /s | slowdown | µs per task at {shallow} | µs per task at {deep} |\n|---|---|---|---|---|---|");
        println!(
            "| driver-only | {c_s:.0} | {c_d:.0} | {:.2}× | {:.0} | {:.0} |",
            c_s / c_d,
            1e6 / c_s,
            1e6 / c_d
        );
        println!(
            "| DEN | {d_s:.0} | {d_d:.0} | {:.2}× | {:.0} | {:.0} |",
            d_s / d_d,
            1e6 / d_s,
            1e6 / d_d
        );
        println!(
            "RESULT depth shallow={shallow} deep={deep} den_shallow_per_s={d_s:.0} den_deep_per_s={d_d:.0} den_slowdown={:.2} db_shallow_per_s={c_s:.0} db_deep_per_s={c_d:.0} db_slowdown={:.2}",
            d_s / d_d,
            c_s / c_d
        );
    }
}
