// piperc: compiles models and strategies into per-device plans.
#include "compiler/driver/Driver.h"

int main(int argc, char **argv) { return mlir::piper::pipercMain(argc, argv); }
