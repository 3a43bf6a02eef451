package io.unstall.flight.cache;

/** Identifies a cached sample: a dataset's sample id. */
public record CacheKey(String dataset, int id) {}
