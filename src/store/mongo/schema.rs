//! The indexes each collection needs, created at start (`Store::ensure_indexes`).

use super::*;

impl MongoStore {
    pub(super) async fn ensure_indexes(&self) -> StoreResult<()> {
        let unique = || IndexOptions::builder().unique(true).build();
        let plain = |keys: Document| IndexModel::builder().keys(keys).build();
        let unique_on = |keys: Document| IndexModel::builder().keys(keys).options(unique()).build();

        let err = db_err("create indexes");
        self.nodes
            .create_index(unique_on(doc! { "node": 1 }))
            .await
            .map_err(&err)?;
        self.queues
            .create_index(unique_on(doc! { "name": 1 }))
            .await
            .map_err(&err)?;
        self.tasks
            .create_indexes([
                plain(doc! { "queue": 1, "status": 1, "node": 1, "priority": -1, "_id": 1 }),
                plain(doc! { "node": 1, "status": 1 }),
                plain(doc! { "status": 1, "mtime": 1 }),
                plain(doc! { "queue": 1, "status": 1 }),
                plain(doc! { "status": 1, "run_at": 1 }),
                IndexModel::builder()
                    .keys(doc! { "key": 1 })
                    .options(
                        IndexOptions::builder()
                            .partial_filter_expression(doc! { "key": { "$type": "string" } })
                            .build(),
                    )
                    .build(),
                IndexModel::builder()
                    .keys(doc! { "batch": 1, "status": 1 })
                    .options(
                        IndexOptions::builder()
                            .partial_filter_expression(doc! { "batch": { "$type": "string" } })
                            .build(),
                    )
                    .build(),
                IndexModel::builder()
                    .keys(doc! { "pending": 1 })
                    .options(
                        IndexOptions::builder()
                            .partial_filter_expression(doc! { "pending": { "$type": "string" } })
                            .build(),
                    )
                    .build(),
                IndexModel::builder()
                    .keys(doc! { "after": 1 })
                    .options(
                        IndexOptions::builder()
                            .partial_filter_expression(doc! { "after": { "$type": "string" } })
                            .build(),
                    )
                    .build(),
                IndexModel::builder()
                    .keys(doc! { "dependents": 1, "status": 1 })
                    .options(
                        IndexOptions::builder()
                            .partial_filter_expression(doc! { "dependents": { "$type": "bool" } })
                            .build(),
                    )
                    .build(),
                IndexModel::builder()
                    .keys(doc! { "queue": 1, "key": 1 })
                    .options(
                        IndexOptions::builder()
                            .unique(true)
                            .partial_filter_expression(doc! { "key": { "$type": "string" } })
                            .build(),
                    )
                    .build(),
            ])
            .await
            .map_err(&err)?;
        let files = self.db.collection::<Document>(gridfs::FILES);
        files
            .create_indexes([
                plain(doc! { "filename": 1, "uploadDate": 1 }),
                plain(doc! { "metadata.task_id": 1 }),
            ])
            .await
            .map_err(&err)?;
        let chunks = self.db.collection::<Document>(gridfs::CHUNKS);
        chunks
            .create_index(unique_on(doc! { "files_id": 1, "n": 1 }))
            .await
            .map_err(&err)?;
        self.slots
            .create_indexes([unique_on(doc! { "queue": 1, "n": 1 }), plain(doc! { "holder": 1 })])
            .await
            .map_err(&err)?;
        self.rates
            .create_index(unique_on(doc! { "queue": 1, "n": 1 }))
            .await
            .map_err(&err)?;
        self.create_stats_indexes().await?;
        self.ensure_plugin_indexes().await
    }
}
