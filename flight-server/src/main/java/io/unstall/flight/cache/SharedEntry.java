package io.unstall.flight.cache;

import java.util.concurrent.atomic.AtomicLong;

/** Tracks which dataset first cached an entry, and counts its bytes once as shared when another uses it. */
class SharedEntry {
  final int length;
  private final String owner;
  private volatile boolean shared;

  SharedEntry(int length, String owner) {
    this.length = length;
    this.owner = owner;
  }

  /** Notes a use by {@code dataset}, adding to {@code sharedBytes} the first time another dataset uses it. */
  void usedBy(String dataset, AtomicLong sharedBytes) {
    if (!shared && !owner.equals(dataset)) {
      synchronized (this) {
        if (!shared) {
          shared = true;
          sharedBytes.addAndGet(length);
        }
      }
    }
  }
}
