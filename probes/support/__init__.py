"""Helpers for writing probes (installed as hma.probes.support): counter growth and rates,
discovery kept between runs, a finding for each read error. Not a check family: it
registers nothing, every family may import it and it imports none; the core never imports it
(what the core uses stays in hma.contracts).
"""
