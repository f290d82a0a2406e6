//! The paged KV-cache allocator with its prefix cache: `policies::kv`, the
//! same bookkeeping the simulator's engines keep (the engine's scheduler
//! and its HTTP routes share one [`KvAllocator`]).

pub use policies::kv::*;
