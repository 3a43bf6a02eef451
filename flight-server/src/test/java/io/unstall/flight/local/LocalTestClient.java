package io.unstall.flight.local;

import static org.junit.jupiter.api.Assertions.assertEquals;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.unstall.flight.protocol.LocalFrames;
import java.io.IOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.List;

/** A minimal client of the UNSL frames: enough to check the server's side of the protocol. */
public final class LocalTestClient implements AutoCloseable {
  static final ObjectMapper JSON = new ObjectMapper();

  final SocketChannel ch;
  final String token;
  public String shm;

  public LocalTestClient(Path socket, String token) throws IOException {
    this.token = token;
    ch = SocketChannel.open(StandardProtocolFamily.UNIX);
    ch.connect(UnixDomainSocketAddress.of(socket));
  }

  public ByteBuffer call(byte[] body) throws IOException {
    send(body);
    return reply();
  }

  /** Sends a request without waiting for its reply. */
  public void send(byte[] body) throws IOException {
    ByteBuffer len = ByteBuffer.allocate(4).order(ByteOrder.LITTLE_ENDIAN).putInt(body.length).flip();
    ByteBuffer[] both = {len, ByteBuffer.wrap(body)};
    while (both[1].hasRemaining()) {
      ch.write(both);
    }
  }

  /** The next reply's body. */
  public ByteBuffer reply() throws IOException {
    ByteBuffer h = ByteBuffer.allocate(4).order(ByteOrder.LITTLE_ENDIAN);
    while (h.hasRemaining()) {
      if (ch.read(h) < 0) {
        throw new IOException("closed");
      }
    }
    ByteBuffer reply = ByteBuffer.allocate(h.flip().getInt()).order(ByteOrder.LITTLE_ENDIAN);
    while (reply.hasRemaining()) {
      if (ch.read(reply) < 0) {
        throw new IOException("closed");
      }
    }
    return reply.flip();
  }

  public JsonNode ok(byte[] body) throws IOException {
    return ok(call(body));
  }

  static JsonNode ok(ByteBuffer r) throws IOException {
    int kind = r.get();
    if (kind == LocalFrames.REPLY_ERROR) {
      r.get(); // the code
    }
    String text = StandardCharsets.UTF_8.decode(r).toString();
    assertEquals(LocalFrames.REPLY_OK, kind, "expected OK, got: " + text);
    return JSON.readTree(text);
  }

  public static byte[] hello(String token) {
    byte[] t = token.getBytes(StandardCharsets.UTF_8);
    ByteBuffer b = ByteBuffer.allocate(8 + t.length).order(ByteOrder.LITTLE_ENDIAN);
    b.put((byte) LocalFrames.HELLO).put(LocalFrames.MAGIC).put((byte) 1).putShort((short) t.length).put(t);
    return b.array();
  }

  /** HELLO, then OPEN a session on {@code dataset}; returns the session id. */
  public long open(String dataset) throws IOException {
    return open(call(hello(token)), dataset);
  }

  /** OPEN a session on {@code dataset}, the HELLO already sent and answered with {@code helloReply}. */
  public long open(ByteBuffer helloReply, String dataset) throws IOException {
    shm = ok(helloReply).get("shm").asText();
    byte[] json = ("{\"dataset\":\"" + dataset + "\",\"name\":\"test\"}").getBytes(StandardCharsets.UTF_8);
    byte[] body = new byte[1 + json.length];
    body[0] = LocalFrames.OPEN;
    System.arraycopy(json, 0, body, 1, json.length);
    return ok(body).get("session").asLong();
  }

  @Override
  public void close() throws IOException {
    ch.close();
  }

  /** A decoded BATCH reply; payloads read by mapping the named files, as a client does. */
  public record Rows(long[] ids, long[] labels, List<String> files, List<byte[]> payloads) {}

  public static Rows batch(ByteBuffer r, String shm) throws IOException {
    assertEquals(LocalFrames.REPLY_BATCH, r.get(), () -> "expected a BATCH: "
        + StandardCharsets.UTF_8.decode(r.position(2)).toString());
    r.position(4);
    int n = r.getInt();
    int nseg = r.getInt();
    int keyBytes = r.getInt();
    long[] ids = new long[n];
    long[] labels = new long[n];
    long[] offsets = new long[n];
    int[] lengths = new int[n];
    int[] segs = new int[n];
    for (int i = 0; i < n; i++) {
      ids[i] = r.getLong();
    }
    for (int i = 0; i < n; i++) {
      labels[i] = r.getLong();
    }
    for (int i = 0; i < n; i++) {
      offsets[i] = r.getLong();
    }
    for (int i = 0; i < n; i++) {
      lengths[i] = r.getInt();
    }
    for (int i = 0; i < n; i++) {
      segs[i] = r.getInt();
    }
    r.position(r.position() + 4 * n + n + keyBytes); // key ends, label validity, keys
    List<String> names = new ArrayList<>();
    for (int s = 0; s < nseg; s++) {
      byte[] name = new byte[Short.toUnsignedInt(r.getShort())];
      r.get(name);
      names.add(new String(name, StandardCharsets.UTF_8));
    }
    List<String> files = new ArrayList<>();
    List<byte[]> payloads = new ArrayList<>();
    for (int i = 0; i < n; i++) {
      String f = names.get(segs[i]);
      files.add(f);
      try (FileChannel fc = FileChannel.open(Path.of(shm, f), StandardOpenOption.READ)) {
        ByteBuffer m = fc.map(FileChannel.MapMode.READ_ONLY, offsets[i], lengths[i]);
        byte[] p = new byte[lengths[i]];
        m.get(p);
        payloads.add(p);
      }
    }
    return new Rows(ids, labels, files, payloads);
  }
}
