/**
 * Classes injected into the bootstrap class loader before any instrumentation is installed.
 *
 * <p>Advice is inlined into JDK classes (FileInputStream, RandomAccessFile, FileChannelImpl) that
 * live in the bootstrap loader, so the inlined code may only call types the bootstrap loader can
 * see. Everything here depends on java.base only: no Byte Buddy, no OpenTelemetry, no lambdas.
 */
package io.unstall.agent.bootstrap;
