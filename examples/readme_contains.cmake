# Fails unless README holds SOURCE verbatim, so the README's example is the one the tests build.
file(READ ${README} readme)
file(READ ${SOURCE} source)
string(FIND "${readme}" "${source}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${README} does not show ${SOURCE} verbatim; paste the file into the README")
endif()
