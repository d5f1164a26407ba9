#include <stdio.h>

int main(void) {
    printf("version: mini (build %d, commit %s) file %s\n", BUILD_NUMBER, BUILD_COMMIT, __FILE__);
    return 0;
}
