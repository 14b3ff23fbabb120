"""What t2t's tests and fault harnesses use to stand in for services: a Google Cloud Storage
emulator on 127.0.0.1 with a fault-injecting front (`gcs_emulator`). Nothing in the library
imports this package."""
