//! The blocking classes of `tollgate.sync`: the same Redis semaphore and token bucket as the
//! asyncio classes (same cores, same keys), waited for through [`crate::blocking`] with the GIL
//! released, for threads, batch jobs and Celery/RQ workers.

pub(crate) mod semaphore;
pub(crate) mod token_bucket;
