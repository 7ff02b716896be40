//! Use cases of the LMSP service: submit, cancel, workers, recovery, purge, live fan-out.
