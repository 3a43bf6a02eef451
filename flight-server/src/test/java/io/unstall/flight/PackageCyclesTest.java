package io.unstall.flight;

import static com.tngtech.archunit.core.domain.JavaClass.Predicates.belongToAnyOf;
import static com.tngtech.archunit.lang.syntax.ArchRuleDefinition.classes;
import static com.tngtech.archunit.library.dependencies.SlicesRuleDefinition.slices;

import com.tngtech.archunit.base.DescribedPredicate;
import com.tngtech.archunit.core.domain.JavaClass;
import com.tngtech.archunit.core.domain.JavaClasses;
import com.tngtech.archunit.core.importer.ClassFileImporter;
import com.tngtech.archunit.core.importer.ImportOption;
import io.unstall.flight.prep.BadImageException;
import io.unstall.flight.prep.ImageHeader;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** The flight-server's packages import each other without a cycle, and so do the image prep classes. */
class PackageCyclesTest {
  static JavaClasses classes;

  @BeforeAll
  static void load() {
    classes = new ClassFileImporter().withImportOption(ImportOption.Predefined.DO_NOT_INCLUDE_TESTS)
        .importPackages("io.unstall.flight");
  }

  @Test
  void noCycleAmongThePackages() {
    slices().matching("io.unstall.flight.(*)..").should().beFreeOfCycles().check(classes);
  }

  /** ImagePrep and PrepPipeline use the header; the header (and its exception) use neither, nor any other class. */
  @Test
  void imageHeaderNeedsNoPrepClass() {
    DescribedPredicate<JavaClass> own = belongToAnyOf(ImageHeader.class, BadImageException.class);
    DescribedPredicate<JavaClass> allowed = DescribedPredicate.describe("its own or outside io.unstall", c -> {
      JavaClass t = c.getBaseComponentType(); // Format[] is Format
      return own.test(t) || !t.getPackageName().startsWith("io.unstall");
    });
    classes().that(own).should().onlyDependOnClassesThat(allowed).check(classes);
  }
}
