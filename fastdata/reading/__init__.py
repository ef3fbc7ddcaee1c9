"""Reading shards: the dataset, its subsets, batch assembly, decoding, epoch order, samplers, read-ahead."""
