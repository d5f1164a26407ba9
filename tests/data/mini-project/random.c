#include <stdio.h>
#include "random.h"

int main(void) {
    puts(salt);
    return 0;
}
