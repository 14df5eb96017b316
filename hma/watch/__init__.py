"""``hma watch``: the controller's watcher for nodes that cannot act for themselves (dead,
wedged, never back from a reboot, stuck completing): docs/watch.md."""
