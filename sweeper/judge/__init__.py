"""How evidence is judged. Pure: failure rates and their intervals (`stats`), when a cell is settled
(`sequential`), a server group's verdict from what its run saw (`verdict`), failure modes (`modes`), the
level of each axis per unit of evidence (`axis_levels`), server starts as the unit of variation
(`overdispersion`), and the smallest conjunction of settings behind each mode (`explain`)."""
