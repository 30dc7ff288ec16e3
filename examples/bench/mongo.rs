//! The MongoDB scenarios: `ceiling` (the driver-only claim + finish loop) and `throughput`
//! (DENs draining trivial tasks beside it, with the CPU and command profiles).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use mongodb::options::FindOneAndUpdateOptions;
use mongodb::Database;

use super::counts::{per_task, table, Commands};
use super::{finish_rate, median, wait_finished, Bench, Cpu};

impl Bench {
    /// Tasks/s of `dens` DENs draining `n` trivial tasks (steady rate, see [`finish_rate`]).
    pub(super) async fn drain(&self, n: usize, dens: usize) -> (f64, (f64, f64)) {
        let db = self.db("drain").await;
        let q = self.queue(&db, self.threads).await;
        self.tasks(&db, q, n, doc! {}).await;
        let cpu = Cpu::now();
        let running: Vec<_> = (0..dens).map(|i| self.den(&db, &format!("bench-{i}"))).collect();
        let done = wait_finished(&db, doc! {"queue": q, "status": 1}, n as u64, Duration::from_secs(600)).await;
        assert!(done, "{dens} DEN(s) did not drain {n} tasks in 10 minutes");
        let cpu = cpu.per_task_since(n);
        for (stop, handle) in running {
            stop.cancel();
            handle.await.unwrap();
        }
        let (rate, _) = finish_rate(&db, doc! {"queue": q, "status": 1}).await;
        db.drop().await.ok();
        (rate, cpu)
    }

    /// One DEN draining `n` tasks on its own client, counting every database command it
    /// sends over its whole run (start-up, ticks, shutdown): commands per task by name and
    /// collection, and the total.
    pub(super) async fn command_profile(&self, n: usize) -> (BTreeMap<String, f64>, f64) {
        let (client, commands) = Commands::client(&self.uri).await;
        let db = self.db("profile").await;
        let q = self.queue(&db, self.threads).await;
        self.tasks(&db, q, n, doc! {}).await;
        let counted = client.database(db.name());
        commands.start();
        let (stop, handle) = self.den(&counted, "bench-profile");
        let done = wait_finished(&db, doc! {"queue": q, "status": 1}, n as u64, Duration::from_secs(600)).await;
        assert!(done, "the DEN did not drain {n} tasks in 10 minutes");
        stop.cancel();
        handle.await.unwrap();
        let counts = commands.stop();
        db.drop().await.ok();
        per_task(&counts, n)
    }

    /// The driver-only loop on `q`: `self.threads` workers, each claiming with the spec's
    /// findOneAndUpdate then writing one finishing update, until `n` tasks are done. Returns
    /// tasks/s (steady rate) and µs per claim+finish pair as one worker saw it.
    /// With `start`, each task also gets the DEN's `status: 0` write between claim and
    /// finish (three round trips per task, as the DEN makes).
    pub(super) async fn driver_loop(&self, db: &Database, q: ObjectId, n: usize, start: bool) -> (f64, f64) {
        let claimed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let workers: Vec<_> = (0..self.threads)
            .map(|w| {
                let tasks = db.collection::<Document>("tasks");
                let claimed = claimed.clone();
                tokio::spawn(async move {
                    let node = format!("driver-{w}");
                    let mut options = FindOneAndUpdateOptions::default();
                    options.sort = Some(doc! {"_id": 1});
                    let (mut pairs, began) = (0u32, Instant::now());
                    while claimed.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < n {
                        let Some(t) = tasks
                            .find_one_and_update(
                                doc! {"node": Bson::Null, "status": -2, "queue": q},
                                doc! {"$set": {"node": &node, "status": -1, "mtime": DateTime::now()}},
                            )
                            .with_options(options.clone())
                            .await
                            .unwrap()
                        else {
                            break;
                        };
                        let id = t.get_object_id("_id").unwrap();
                        let claimed_status = if start {
                            tasks
                                .update_one(
                                    doc! {"_id": id, "node": &node, "status": -1},
                                    doc! {"$set": {"status": 0, "mtime": DateTime::now()}},
                                )
                                .await
                                .unwrap();
                            0
                        } else {
                            -1
                        };
                        tasks
                            .update_one(
                                doc! {"_id": id, "node": &node, "status": claimed_status},
                                doc! {"$set": {"status": 1, "stdout": "hello\n", "stderr": "", "mtime": DateTime::now()}},
                            )
                            .await
                            .unwrap();
                        pairs += 1;
                    }
                    began.elapsed().as_secs_f64() * 1e6 / f64::from(pairs.max(1))
                })
            })
            .collect();
        let mut per_pair = Vec::new();
        for w in workers {
            per_pair.push(w.await.unwrap());
        }
        let (rate, _) = finish_rate(db, doc! {"queue": q, "status": 1, "node": {"$regex": "^driver-"}}).await;
        (rate, median(per_pair))
    }

    /// Tasks/s of the driver-only loop over `n` tasks of a fresh queue.
    pub(super) async fn ceiling(&self, n: usize, start: bool) -> (f64, (f64, f64)) {
        let db = self.db("ceiling").await;
        let q = self.queue(&db, self.threads).await;
        self.tasks(&db, q, n, doc! {}).await;
        let cpu = Cpu::now();
        let (rate, _) = self.driver_loop(&db, q, n, start).await;
        let cpu = cpu.per_task_since(n);
        db.drop().await.ok();
        (rate, cpu)
    }
    pub(super) async fn ceiling_scenario(&self) {
        let mut last = String::new();
        println!(
            "\n## ceiling: driver-only claim (findOneAndUpdate) + finish (update_one), {} workers (median of {} rounds)",
            self.threads, self.rounds
        );
        println!("| N | claim+finish /s |\n|---|---|");
        for &n in &self.sizes {
            let mut c = Vec::new();
            for _ in 0..self.rounds_for(n) {
                c.push(self.ceiling(n, false).await.0);
            }
            let c = median(c);
            println!("| {n} | {c:.0} |");
            last = format!("n={n} threads={} ceiling_per_s={c:.0}", self.threads);
        }
        println!("RESULT ceiling {last}");
    }

    /// Rounds for a run over `n` tasks: all of them for small runs, fewer for big ones.
    pub(super) fn rounds_for(&self, n: usize) -> usize {
        if n > 5_000 {
            1.max(self.rounds / 3)
        } else {
            self.rounds
        }
    }

    pub(super) async fn throughput(&self) {
        println!(
            "\n## throughput: DENs draining N trivial demo tasks, queue threads {} (medians; rounds per N below)",
            self.threads
        );
        println!("| N | rounds | ceiling /s (claim + finish) | 1 DEN /s | 1 DEN ÷ ceiling | 2 DENs /s | 2 DENs ÷ ceiling | driver with the DEN's start write /s | 1 DEN ÷ that |\n|---|---|---|---|---|---|---|---|---|");
        let (mut results, mut ceilings, mut cpu_rows, mut cpu_kv) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        // The largest N's figures also go unprefixed at the front of the RESULT line.
        let mut headline = None;
        for &n in &self.sizes {
            let rounds = self.rounds_for(n);
            let (mut c, mut c3, mut one, mut two) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            let (mut c_db, mut c_own, mut one_db, mut one_own) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for _ in 0..rounds {
                c3.push(self.ceiling(n, true).await.0);
                let (rate, (db, own)) = self.ceiling(n, false).await;
                c.push(rate);
                c_db.push(db);
                c_own.push(own);
                let (rate, (db, own)) = self.drain(n, 1).await;
                one.push(rate);
                one_db.push(db);
                one_own.push(own);
                two.push(self.drain(n, 2).await.0);
            }
            let (c, c3, one, two) = (median(c), median(c3), median(one), median(two));
            ceilings.push((n, c));
            let (c_db, c_own, one_db, one_own) = (median(c_db), median(c_own), median(one_db), median(one_own));
            cpu_rows.push(format!("| {n} | {c_db:.0} | {c_own:.0} | {one_db:.0} | {one_own:.0} |"));
            cpu_kv.push(format!(
                "n{n}_db_cpu_us_per_task_driver={c_db:.0} n{n}_db_cpu_us_per_task_den={one_db:.0} n{n}_den_cpu_us_per_task={one_own:.0}"
            ));
            println!(
                "| {n} | {rounds} | {c:.0} | {one:.0} | {:.2} | {two:.0} | {:.2} | {c3:.0} | {:.2} |",
                one / c,
                two / c,
                one / c3
            );
            headline = Some(format!(
                "n={n} tasks_per_s={one:.0} ratio_to_ceiling={:.2} two_dens_per_s={two:.0}",
                one / c
            ));
            results.push(format!(
                "n{n}_ceiling_per_s={c:.0} n{n}_tasks_per_s={one:.0} n{n}_ratio_to_ceiling={:.2} n{n}_two_dens_per_s={two:.0} n{n}_two_dens_ratio={:.2} n{n}_three_writes_per_s={c3:.0} n{n}_ratio_to_three_writes={:.2}",
                one / c,
                two / c,
                one / c3
            ));
        }
        println!("\nCPU µs per task over the same runs (medians): the database server, and this process (driver loop, or the DEN with the bench's polling)");
        println!("| N | DB, driver-only | driver process | DB, 1 DEN | DEN process |\n|---|---|---|---|---|");
        for row in &cpu_rows {
            println!("{row}");
        }
        let n = self.sizes[0];
        let (profile, total) = self.command_profile(n).await;
        println!(
            "\nDatabase commands per task of one DEN draining {n} tasks (the whole run: start-up, ticks, shutdown)"
        );
        println!("{}", table(&[("per task", &profile)]));
        cpu_kv.push(format!("n{n}_den_commands_per_task={total:.2}"));
        if let Some((n, c)) = ceilings.last() {
            println!("RESULT ceiling n={n} threads={} ceiling_per_s={c:.0}", self.threads);
        }
        println!(
            "RESULT throughput threads={} {} {} {}",
            self.threads,
            headline.unwrap_or_default(),
            results.join(" "),
            cpu_kv.join(" ")
        );
    }
}
