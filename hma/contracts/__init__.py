"""What every plugin and stage shares: findings, severities, options, the probe,
event-source, alert and cluster-backend contracts, the catalogue, the label token."""
