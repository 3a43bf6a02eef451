package io.unstall.flight.format;

import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.storage.Storage;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Locale;
import java.util.Set;
import java.util.function.LongConsumer;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * Tar shards in the WebDataset convention: the regular members of each {@code .tar} file (sorted by path) are
 * grouped into samples by key, as webdataset's {@code group_by_keys} does: a member's key is its path up to the
 * first dot of its last component, its extension the rest (lower-cased); consecutive members with one key form a
 * sample; members without a dot and {@code __meta__} names are skipped; an extension twice in a sample is an error.
 *
 * <p>A sample's bytes are its members as they lie in the shard, headers included (from its first member's first
 * header to its last member's data): the client splits them by their headers. Neighbouring samples lie next to
 * each other, so a shard read in order is coalesced into large requests by the batch reader. Options: {@code
 * payload}, a field or list of fields, each an extension or alternatives {@code "jpg;png"} (webdataset's {@code
 * to_tuple}): then every sample must have each field, and the client yields the payload rather than a dict;
 * {@code label}, an extension whose member holds an ASCII integer ({@code .cls}): read while indexing, it is the
 * sample's label.
 */
public final class WebDatasetFormat implements ContentIndexed {
  /** webdataset's {@code base_plus_ext}. */
  private static final Pattern KEY = Pattern.compile("^((?:.*/|)[^.]+)[.]([^/]*)$");
  /** webdataset's {@code skip_meta}, and its top-level {@code __x__} rule. */
  private static final Pattern META = Pattern.compile("^__[^/]*__($|/)");
  private static final int MAX_LABEL = 64;

  private final List<List<String>> payload = new ArrayList<>();
  private final String label;

  public WebDatasetFormat(FormatOptions options) {
    options.allow("payload", "label");
    for (String field : options.strings("payload")) {
      List<String> alternatives = new ArrayList<>();
      for (String ext : field.split(";")) {
        if (ext.isBlank() || ext.startsWith(".")) {
          throw options.problem("payload", "has the field '" + field + "'; write extensions without a dot,"
              + " alternatives separated by ';' (\"jpg;png\")");
        }
        alternatives.add(ext.toLowerCase(Locale.ROOT));
      }
      payload.add(alternatives);
    }
    String l = options.string("label", null);
    if (l != null && l.startsWith(".")) {
      throw options.problem("label", "must be an extension without a dot, got '" + l + "'");
    }
    this.label = l == null ? null : l.toLowerCase(Locale.ROOT);
  }

  @Override
  public String name() {
    return "webdataset";
  }

  @Override
  public SampleIndex index(Storage storage, LongConsumer progress) throws IOException {
    List<String> shards = ContentIndexed.files(storage, ".tar", null);
    SampleIndex.Builder b = new SampleIndex.Builder(label != null).layout(layout());
    for (String shard : shards) {
      int fileNo = b.file(shard);
      TarMembers tar = new TarMembers(storage, shard, storage.pin(shard));
      Sample s = null;
      for (TarMembers.Member m; (m = tar.next()) != null; ) {
        if (META.matcher(m.name()).find()) {
          continue;
        }
        Matcher km = KEY.matcher(m.name());
        if (!km.matches()) {
          continue;
        }
        String key = km.group(1);
        String ext = km.group(2).toLowerCase(Locale.ROOT);
        if (s == null || !s.key.equals(key)) {
          if (s != null) {
            add(b, fileNo, s, tar);
          }
          s = new Sample(key, m.headerOffset());
        }
        if (!s.exts.add(ext)) {
          throw tar.corrupt(m.headerOffset(), "member '" + m.name() + "': the extension '" + ext
              + "' twice in sample '" + key + "' (webdataset: duplicate file name)");
        }
        s.end = m.dataOffset() + m.size();
        if (ext.equals(label)) {
          s.label = parseLabel(tar, m);
        }
      }
      if (s != null) {
        add(b, fileNo, s, tar);
      }
      progress.accept(b.size());
    }
    return b.build();
  }

  private void add(SampleIndex.Builder b, int fileNo, Sample s, TarMembers tar) throws CorruptRecordException {
    for (List<String> field : payload) {
      if (field.stream().noneMatch(s.exts::contains)) {
        throw tar.corrupt(s.start, "sample '" + s.key + "' has no ." + String.join(" or .", field)
            + " member (option payload; it has " + String.join(", ", s.exts) + ")");
      }
    }
    if (label != null && s.label == null) {
      throw tar.corrupt(s.start, "sample '" + s.key + "' has no ." + label + " member (option label; it has "
          + String.join(", ", s.exts) + ")");
    }
    b.add(fileNo, s.start, s.end - s.start, s.label == null ? -1 : s.label);
  }

  private Long parseLabel(TarMembers tar, TarMembers.Member m) throws IOException {
    String text = new String(tar.read(m, MAX_LABEL), StandardCharsets.UTF_8).strip();
    try {
      return Long.parseLong(text);
    } catch (NumberFormatException e) {
      throw tar.corrupt(m.headerOffset(), "member '" + m.name() + "' (option label) holds '" + text
          + "', not an integer");
    }
  }

  /** What the client's decoder needs: the payload fields and the label extension. */
  private String layout() {
    ObjectNode o = JsonNodeFactory.instance.objectNode();
    if (payload.isEmpty()) {
      o.putNull("payload");
    } else {
      var fields = o.putArray("payload");
      payload.forEach(f -> f.forEach(fields.addArray()::add));
    }
    if (label == null) {
      o.putNull("label");
    } else {
      o.put("label", label);
    }
    return o.toString();
  }


  /** A sample being gathered: its key, extensions, byte range and label. */
  private static final class Sample {
    final String key;
    final long start;
    final Set<String> exts = new LinkedHashSet<>();
    long end;
    Long label;

    Sample(String key, long start) {
      this.key = key;
      this.start = start;
    }
  }
}
