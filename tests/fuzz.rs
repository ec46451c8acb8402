//! Bodies of the fuzz targets (filled in below).
