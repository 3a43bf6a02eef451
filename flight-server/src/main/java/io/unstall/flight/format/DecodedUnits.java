package io.unstall.flight.format;

import java.io.IOException;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import org.apache.arrow.memory.BufferAllocator;

/**
 * Decoded units of one dataset (Parquet row groups, HDF5 chunks) kept so that neighbouring samples are served
 * from one decode: each unit is decoded once however many threads ask for it at the same time, held in the
 * dataset's allocator (so within the sidecar's memory budget), and the least recently used idle units are freed
 * when a new one needs the room: its own first, then other datasets' (their allocators share one parent, the
 * sidecar's {@code formats}). A unit in use is never freed under its reader.
 */
final class DecodedUnits<K, V extends AutoCloseable> implements AutoCloseable {

  /** A decode that could not allocate its unit; the message names the unit and the memory. */
  static final class NoRoom extends IOException {
    NoRoom(String message, Throwable cause) {
      super(message, cause);
    }
  }

  /** Decodes one unit into {@code memory}; throws {@link NoRoom} when the allocator refuses. */
  interface Decoder<K, V> {
    V decode(K key, BufferAllocator memory) throws IOException;
  }

  /** A unit lent to a reader: close it to give it back. */
  final class Lease implements AutoCloseable {
    private final Entry entry;

    private Lease(Entry entry) {
      this.entry = entry;
    }

    V value() {
      return entry.value;
    }

    @Override
    public void close() {
      release(entry);
    }
  }

  private final class Entry {
    final CompletableFuture<V> decoded = new CompletableFuture<>();
    V value;
    int users;
    boolean evicted;
  }

  /** The live instances by parent allocator: a dataset short of room frees other datasets' idle units. */
  private static final java.util.Map<BufferAllocator, java.util.Set<DecodedUnits<?, ?>>> BY_PARENT =
      new java.util.WeakHashMap<>();

  private final BufferAllocator parent;
  private final BufferAllocator memory;
  private final Decoder<K, V> decoder;
  private final LinkedHashMap<K, Entry> units = new LinkedHashMap<>(16, 0.75f, true);

  /** Units of one dataset in a new child {@code name} of {@code parent} (as large as it), closed with them. */
  DecodedUnits(BufferAllocator parent, String name, Decoder<K, V> decoder) {
    this.parent = parent;
    this.memory = parent.newChildAllocator(name, 0, parent.getLimit());
    this.decoder = decoder;
    synchronized (BY_PARENT) {
      BY_PARENT.computeIfAbsent(parent, p -> new java.util.HashSet<>()).add(this);
    }
  }

  /** The dataset's allocator, for decodes outside the cache (indexing). */
  BufferAllocator memory() {
    return memory;
  }

  /**
   * The unit {@code key}, decoded now or earlier; {@code estimate} bytes (what it will take) are made room for
   * first by freeing idle units.
   */
  Lease get(K key, long estimate) throws IOException {
    Entry e;
    boolean mine = false;
    if (memory.getHeadroom() < estimate) {
      freeOthers(estimate); // outside our lock: each sibling takes only its own
    }
    synchronized (this) {
      e = units.get(key);
      if (e == null) {
        makeRoom(estimate);
        e = new Entry();
        units.put(key, e);
        mine = true;
      }
      e.users++;
    }
    if (mine) {
      try {
        V v;
        try {
          v = decoder.decode(key, memory);
        } catch (NoRoom short_) { // the estimate was short: free every idle unit and try once more
          freeOthers(Long.MAX_VALUE);
          synchronized (this) {
            makeRoom(Long.MAX_VALUE);
          }
          v = decoder.decode(key, memory);
        }
        synchronized (this) {
          e.value = v;
        }
        e.decoded.complete(v);
      } catch (IOException | RuntimeException | Error t) {
        synchronized (this) {
          units.remove(key, e);
          e.users--;
        }
        e.decoded.completeExceptionally(t);
        throw t;
      }
    } else {
      try {
        e.decoded.get();
      } catch (InterruptedException ie) {
        Thread.currentThread().interrupt();
        release(e);
        throw new java.io.InterruptedIOException("interrupted waiting for a decode of " + key);
      } catch (ExecutionException ee) {
        release(e);
        Throwable c = ee.getCause();
        throw c instanceof IOException io ? new IOException(io.getMessage(), io) : new IOException(c.toString(), c);
      }
    }
    return new Lease(e);
  }

  /** Frees other datasets' idle units (least recently used first, per dataset) until {@code estimate} fits. */
  private void freeOthers(long estimate) {
    java.util.List<DecodedUnits<?, ?>> others;
    synchronized (BY_PARENT) {
      others = new java.util.ArrayList<>(BY_PARENT.getOrDefault(parent, java.util.Set.of()));
    }
    for (DecodedUnits<?, ?> other : others) {
      if (memory.getHeadroom() >= estimate) {
        return;
      }
      if (other != this) {
        synchronized (other) {
          other.makeRoom(estimate, memory);
        }
      }
    }
  }

  private void makeRoom(long estimate) {
    makeRoom(estimate, memory);
  }

  /** Frees this instance's idle units, least recently used first, until {@code estimate} fits in {@code room}. */
  private void makeRoom(long estimate, BufferAllocator room) {
    Iterator<Map.Entry<K, Entry>> it = units.entrySet().iterator();
    while (it.hasNext() && room.getHeadroom() < estimate) {
      Entry old = it.next().getValue();
      if (old.users == 0 && old.value != null) {
        it.remove();
        closeQuietly(old.value);
      }
    }
  }

  private synchronized void release(Entry e) {
    e.users--;
    if (e.users == 0 && e.evicted && e.value != null) {
      closeQuietly(e.value);
    }
  }

  private static void closeQuietly(AutoCloseable c) {
    try {
      c.close();
    } catch (Exception ignored) {
      // freeing Arrow buffers does not fail
    }
  }

  /** Frees every unit and the allocator (the dataset is closed: no reader holds a unit). */
  @Override
  public synchronized void close() {
    for (Entry e : units.values()) {
      e.evicted = true;
      if (e.users == 0 && e.value != null) {
        closeQuietly(e.value);
      }
    }
    units.clear();
    memory.close();
    synchronized (BY_PARENT) {
      java.util.Set<DecodedUnits<?, ?>> siblings = BY_PARENT.get(parent);
      if (siblings != null) {
        siblings.remove(this);
      }
    }
  }
}
