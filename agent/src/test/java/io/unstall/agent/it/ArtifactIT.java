package io.unstall.agent.it;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import javax.xml.parsers.DocumentBuilderFactory;
import org.junit.jupiter.api.Test;
import org.w3c.dom.Element;
import org.w3c.dom.NodeList;

/**
 * What {@code mvn install} installs as {@code io.unstall:unstall-agent}: the shaded jar (the shade
 * replaced the thin one, kept as {@code original-unstall-agent.jar}) and the dependency-reduced pom,
 * which leaves a consumer nothing to resolve at run time. Checked on the build's output, never by
 * installing into a Maven repository.
 */
class ArtifactIT {
  @Test
  void theInstalledArtifactIsTheShadedAgentWithAPomOfNoRuntimeDependencies() throws Exception {
    Path jar = ForkedJvm.agentJar();
    assertTrue(Files.isRegularFile(jar.resolveSibling("original-" + jar.getFileName())), jar.toString());
    Path pom = Paths.get(ForkedJvm.property("unstall.agent.pom"));
    var doc = DocumentBuilderFactory.newInstance().newDocumentBuilder().parse(pom.toFile());
    Element project = doc.getDocumentElement();
    assertEquals("unstall-agent", child(project, "artifactId"));
    List<String> runtime = new ArrayList<>();
    NodeList deps = project.getElementsByTagName("dependency");
    for (int i = 0; i < deps.getLength(); i++) {
      Element d = (Element) deps.item(i);
      if (!"test".equals(child(d, "scope"))) {
        runtime.add(child(d, "groupId") + ":" + child(d, "artifactId"));
      }
    }
    assertEquals(List.of(), runtime, "dependencies a consumer of " + pom + " would resolve");
  }

  private static String child(Element parent, String name) {
    NodeList nodes = parent.getChildNodes();
    for (int i = 0; i < nodes.getLength(); i++) {
      if (nodes.item(i) instanceof Element e && e.getTagName().equals(name)) {
        return e.getTextContent().trim();
      }
    }
    return null;
  }
}
