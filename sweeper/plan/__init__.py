"""What to run next, and what it costs. Pure: designs (the full product or a covering subset), the cost
model in GPU-seconds, the budget, and the zoom that tells candidate conjunctions apart."""
