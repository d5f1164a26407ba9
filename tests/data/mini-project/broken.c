int main(void) { return this_does_not_compile; }
