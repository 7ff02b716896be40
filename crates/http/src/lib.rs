//! The HTTP edge and the lmsp binary.
