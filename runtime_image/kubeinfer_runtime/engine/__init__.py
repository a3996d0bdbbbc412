"""The continuous-batching engine: paged KV cache, block manager, scheduler, model runner."""
