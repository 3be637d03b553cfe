"""Who holds which GPU: the cluster state, its snapshot, the GPU ledger, and the readings laid over them."""
