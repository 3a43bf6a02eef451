package io.unstall.flight;

import java.net.InetAddress;
import java.net.ServerSocket;
import java.util.Random;

/** Ports for servers that bind after the test picked them (Hazelcast members, peer ports). */
public final class TestPorts {
  private TestPorts() {}

  /**
   * A port free now, below Linux's ephemeral range (32768..), so that the port-0 servers a test starts before the
   * server that takes this port binds (Flight servers, clients' sockets) cannot be handed it in between.
   */
  public static int belowEphemeral() throws Exception {
    Random r = new Random();
    while (true) {
      int port = 20000 + r.nextInt(12000);
      try (ServerSocket s = new ServerSocket(port, 1, InetAddress.getLoopbackAddress())) {
        return s.getLocalPort();
      } catch (java.io.IOException taken) {
        // try another
      }
    }
  }
}
