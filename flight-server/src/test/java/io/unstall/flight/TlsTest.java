package io.unstall.flight;

import static io.unstall.flight.FlightTestClient.TOKEN;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.unstall.flight.protocol.FetchTicket;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.TimeUnit;
import org.apache.arrow.flight.CallHeaders;
import org.apache.arrow.flight.FlightCallHeaders;
import org.apache.arrow.flight.FlightClient;
import org.apache.arrow.flight.FlightRuntimeException;
import org.apache.arrow.flight.FlightStream;
import org.apache.arrow.flight.HeaderCallOption;
import org.apache.arrow.flight.Location;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.VarBinaryVector;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** An exposed sidecar speaks TLS and still requires the token; a plaintext client gets nothing. */
class TlsTest {
  @TempDir Path dir;

  /** A self-signed certificate for 127.0.0.1, made with openssl. */
  private void selfSigned(Path cert, Path key) throws Exception {
    Process p = new ProcessBuilder(
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
            "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", key.toString(), "-out", cert.toString())
        .redirectErrorStream(true)
        .start();
    String out = new String(p.getInputStream().readAllBytes());
    assertTrue(p.waitFor(60, TimeUnit.SECONDS) && p.exitValue() == 0, "openssl failed: " + out);
  }

  @Test
  void tlsWithTheTokenServesAndPlaintextIsRefused() throws Exception {
    Path cert = dir.resolve("cert.pem");
    Path key = dir.resolve("key.pem");
    selfSigned(cert, key);
    byte[] sample = "a sample over TLS".getBytes();
    Files.createDirectories(dir.resolve("d/c0"));
    Files.write(dir.resolve("d/c0/x.png"), sample);
    try (BufferAllocator root = new RootAllocator(64L << 20);
        DataPlane plane = DataPlane.builder(root, TOKEN).port(0).tls(cert.toFile(), key.toFile()).build().start();
        InputStream trusted = Files.newInputStream(cert);
        FlightClient tls = FlightClient.builder(root, plane.location()).trustedCertificates(trusted).build();
        FlightClient plain = FlightClient.builder(root, Location.forGrpcInsecure("127.0.0.1", plane.port())).build()) {
      assertEquals("grpc+tls", plane.location().getUri().getScheme());
      plane.registry().register("d", "imagefolder", dir.resolve("d").toString());
      CallHeaders h = new FlightCallHeaders();
      h.insert("authorization", "Bearer " + TOKEN);
      try (FlightStream s =
          tls.getStream(new FetchTicket("d", 0, new long[] {0}).toTicket(), new HeaderCallOption(h))) {
        assertTrue(s.next());
        assertArrayEquals(sample, ((VarBinaryVector) s.getRoot().getVector("payload")).get(0));
      }
      FlightRuntimeException noToken = assertThrows(FlightRuntimeException.class, () -> {
        try (FlightStream s = tls.getStream(new FetchTicket("d", 0, new long[] {0}).toTicket())) {
          s.next();
        }
      });
      assertEquals(org.apache.arrow.flight.FlightStatusCode.UNAUTHENTICATED, noToken.status().code());
      FlightRuntimeException plaintext = assertThrows(FlightRuntimeException.class, () -> {
        try (FlightStream s =
            plain.getStream(new FetchTicket("d", 0, new long[] {0}).toTicket(), new HeaderCallOption(h))) {
          s.next();
        }
      });
      assertEquals(org.apache.arrow.flight.FlightStatusCode.UNAVAILABLE, plaintext.status().code(),
          plaintext.toString());
    }
  }
}
