"""What is asked: matrix files parsed into typed cells (schema, expansion, slices), replay suites and the
checks that judge an answer, the positions every input error names, and the outcome words (`status`)
a run records. Pure apart from reading the input files it is given: it starts nothing and reads no
results."""
