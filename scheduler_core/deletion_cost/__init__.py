"""Pod deletion costs: the policies, the refresher's plan, and the ReplicaSet controller's scale-down order."""
